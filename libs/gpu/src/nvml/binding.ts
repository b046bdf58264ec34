// The slice of NVML this package calls, bound through koffi. Declarations follow nvml.h:
//   nvmlReturn_t is a C enum (int); nvmlDevice_t is an opaque pointer (a BigInt in koffi 3).
import type Koffi from 'koffi';
import type { LibraryHandle } from 'koffi';
import { GpuSourceError, messageOf, NvmlError } from '../errors.js';
import { NVML_UUID_BUFFER } from '../defaults.js';

/** A device handle as koffi returns `nvmlDevice_t`. */
export type NvmlDevice = bigint;

export interface NvmlMemory {
  total: number;
  free: number;
  used: number;
}

/** NVML, loaded. Every call throws an NvmlError naming the function when NVML refuses. */
export interface NvmlBinding {
  /** nvmlInit_v2, on koffi's worker pool: the first init of a driver can take seconds. */
  init(): Promise<void>;
  deviceCount(): number;
  handleByIndex(index: number): NvmlDevice;
  /** `nvmlUtilization_t.gpu`: percent of the last sample period a kernel was running. */
  utilizationPercent(device: NvmlDevice): number;
  memory(device: NvmlDevice): NvmlMemory;
  uuid(device: NvmlDevice): string;
  shutdown(): void;
  /** Drops the library (after shutdown). */
  unload(): void;
}

type KoffiFunction = ReturnType<LibraryHandle['func']>;

const NVML_SUCCESS = 0;

/** The device cannot do what was asked, e.g. utilization on a MIG-enabled GPU. */
export const NVML_ERROR_NOT_SUPPORTED = 3;

/**
 * Loads `libraryPath` and binds the NVML functions. Throws a one-line ERR_GPU_LIBRARY
 * error when koffi, the library or one of its symbols is missing.
 */
export async function loadNvml(libraryPath: string): Promise<NvmlBinding> {
  const unusable = (what: string, error: unknown) =>
    new GpuSourceError(
      'ERR_GPU_LIBRARY',
      `GPU_SOURCE=nvml: ${what} (${messageOf(error)}); the dispatcher runs without GPU input`,
      { cause: error },
    );

  let koffi: typeof Koffi;
  try {
    // Loaded on demand: a dispatcher without GPU_SOURCE=nvml never loads native code.
    koffi = (await import('koffi')).default;
  } catch (error) {
    throw unusable('cannot load the FFI module koffi', error);
  }

  let lib: LibraryHandle;
  try {
    lib = koffi.load(libraryPath);
  } catch (error) {
    throw unusable(`cannot load ${libraryPath}`, error);
  }

  // Anonymous structs: koffi's type registry is process-wide, named types may be declared once.
  const Utilization = koffi.struct({ gpu: 'unsigned int', memory: 'unsigned int' });
  const Memory = koffi.struct({
    total: 'unsigned long long',
    free: 'unsigned long long',
    used: 'unsigned long long',
  });

  let fns: Record<
    | 'nvmlInit_v2'
    | 'nvmlShutdown'
    | 'nvmlErrorString'
    | 'nvmlDeviceGetCount_v2'
    | 'nvmlDeviceGetHandleByIndex_v2'
    | 'nvmlDeviceGetUtilizationRates'
    | 'nvmlDeviceGetMemoryInfo'
    | 'nvmlDeviceGetUUID',
    KoffiFunction
  >;
  try {
    fns = {
      nvmlInit_v2: lib.func('nvmlInit_v2', 'int', []),
      nvmlShutdown: lib.func('nvmlShutdown', 'int', []),
      nvmlErrorString: lib.func('nvmlErrorString', 'const char *', ['int']),
      nvmlDeviceGetCount_v2: lib.func('nvmlDeviceGetCount_v2', 'int', [
        koffi.out(koffi.pointer('unsigned int')),
      ]),
      nvmlDeviceGetHandleByIndex_v2: lib.func('nvmlDeviceGetHandleByIndex_v2', 'int', [
        'unsigned int',
        koffi.out(koffi.pointer('void *')),
      ]),
      nvmlDeviceGetUtilizationRates: lib.func('nvmlDeviceGetUtilizationRates', 'int', [
        'void *',
        koffi.out(koffi.pointer(Utilization)),
      ]),
      nvmlDeviceGetMemoryInfo: lib.func('nvmlDeviceGetMemoryInfo', 'int', [
        'void *',
        koffi.out(koffi.pointer(Memory)),
      ]),
      nvmlDeviceGetUUID: lib.func('nvmlDeviceGetUUID', 'int', ['void *', 'char *', 'unsigned int']),
    };
  } catch (error) {
    lib.unload();
    throw unusable(`${libraryPath} is not a usable NVML`, error);
  }

  function check(fn: keyof typeof fns, rc: number): void {
    if (rc === NVML_SUCCESS) return;
    let text: string;
    try {
      text = String(fns.nvmlErrorString(rc) ?? 'no description');
    } catch {
      text = 'no description';
    }
    throw new NvmlError(fn, rc, text);
  }

  return {
    init() {
      return new Promise<void>((resolve, reject) => {
        fns.nvmlInit_v2.async((error: unknown, rc: number) => {
          if (error) reject(unusable('nvmlInit_v2 could not be called', error));
          else {
            try {
              check('nvmlInit_v2', rc);
              resolve();
            } catch (failed) {
              reject(failed);
            }
          }
        });
      });
    },
    deviceCount() {
      const out = [0];
      check('nvmlDeviceGetCount_v2', fns.nvmlDeviceGetCount_v2(out));
      return Number(out[0]);
    },
    handleByIndex(index) {
      const out: (bigint | null)[] = [null];
      check('nvmlDeviceGetHandleByIndex_v2', fns.nvmlDeviceGetHandleByIndex_v2(index, out));
      if (out[0] === null || out[0] === undefined)
        throw new NvmlError('nvmlDeviceGetHandleByIndex_v2', 0, 'returned a null handle');
      return out[0];
    },
    utilizationPercent(device) {
      const out = { gpu: 0, memory: 0 };
      check('nvmlDeviceGetUtilizationRates', fns.nvmlDeviceGetUtilizationRates(device, out));
      return Number(out.gpu);
    },
    memory(device) {
      const out: Record<'total' | 'free' | 'used', number | bigint> = {
        total: 0,
        free: 0,
        used: 0,
      };
      check('nvmlDeviceGetMemoryInfo', fns.nvmlDeviceGetMemoryInfo(device, out));
      // unsigned long long arrives as a Number below 2^53 (9 PiB) and a BigInt above.
      return { total: Number(out.total), free: Number(out.free), used: Number(out.used) };
    },
    uuid(device) {
      const buffer = Buffer.alloc(NVML_UUID_BUFFER);
      check('nvmlDeviceGetUUID', fns.nvmlDeviceGetUUID(device, buffer, buffer.length));
      const end = buffer.indexOf(0);
      return buffer.toString('latin1', 0, end === -1 ? buffer.length : end);
    },
    shutdown() {
      check('nvmlShutdown', fns.nvmlShutdown());
    },
    unload() {
      lib.unload();
    },
  };
}
