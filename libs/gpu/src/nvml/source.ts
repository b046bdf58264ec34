import { NVML_LIBRARY } from '../defaults.js';
import { GpuSourceError, NvmlError } from '../errors.js';
import { createPollingSource, type PollTarget } from '../polling-source.js';
import { gpuReading } from '../reading.js';
import type { GpuReading, GpuSource } from '../types.js';
import {
  loadNvml,
  NVML_ERROR_NOT_SUPPORTED,
  type NvmlBinding,
  type NvmlDevice,
} from './binding.js';

interface Device {
  index: number;
  handle: NvmlDevice;
  uuid: string;
}

export interface NvmlSourceOptions {
  pollMs: number;
  now: () => number;
  libraryPath?: string;
}

/**
 * GPU load straight from the driver through NVML. `start()` loads the library, runs
 * nvmlInit_v2 on koffi's worker pool (a cold driver can take seconds) and learns the devices
 * (count, handles, UUIDs: fixed for the life of an NVML session). Each poll then makes two
 * synchronous calls per GPU (utilization, memory) on the event loop. They are cheap, a few
 * microseconds each: the driver answers from counters it keeps, and holding NVML initialised
 * keeps the driver loaded even without persistence mode. An async call would cost more in
 * thread hand-off than the call itself. A failed call fails the whole reading (a snapshot
 * with a GPU missing would read as a smaller machine), except NVML_ERROR_NOT_SUPPORTED: a
 * GPU that cannot report a field (utilization on a MIG-enabled GPU) never will in this
 * session, so it is left out of every reading from then on, said once in a 'warning'.
 */
export function createNvmlSource(options: NvmlSourceOptions): GpuSource {
  const libraryPath = options.libraryPath ?? NVML_LIBRARY;
  return createPollingSource({
    kind: 'nvml',
    pollMs: options.pollMs,
    now: options.now,
    open: (warn) => openNvml(libraryPath, warn),
  });
}

async function openNvml(libraryPath: string, warn: (e: Error) => void): Promise<PollTarget> {
  const nvml = await loadNvml(libraryPath);
  try {
    await nvml.init();
  } catch (error) {
    nvml.unload();
    throw error;
  }
  let devices: Device[];
  try {
    devices = listDevices(nvml);
  } catch (error) {
    close(nvml);
    throw error;
  }
  return {
    read: reader(nvml, devices, warn),
    close: () => close(nvml),
  };
}

function listDevices(nvml: NvmlBinding) {
  const count = nvml.deviceCount();
  const devices = [];
  for (let index = 0; index < count; index++) {
    const handle = nvml.handleByIndex(index);
    devices.push({ index, handle, uuid: nvml.uuid(handle) });
  }
  return devices;
}

/**
 * Reads every device still readable. A device that answers Not Supported is dropped for
 * good, with one 'warning'; when none is left, one more says so and readings carry no GPU
 * (as on a machine without one). Any other failure fails the reading.
 */
function reader(nvml: NvmlBinding, devices: Device[], warn: (e: Error) => void) {
  let readable = devices;
  return (): GpuReading[] => {
    const readings: GpuReading[] = [];
    const before = readable.length;
    for (const device of readable) {
      try {
        readings.push(readDevice(nvml, device));
      } catch (error) {
        if (!(error instanceof NvmlError && error.nvmlReturn === NVML_ERROR_NOT_SUPPORTED))
          throw error;
        readable = readable.filter((d) => d !== device);
        warn(
          new GpuSourceError(
            'ERR_GPU_UNSUPPORTED',
            `GPU_SOURCE=nvml: GPU ${device.index} (${device.uuid}) is left out of every reading: ` +
              `${error.function} answers Not Supported (nvmlReturn_t ${error.nvmlReturn}), ` +
              'as on a MIG-enabled GPU',
            { cause: error },
          ),
        );
      }
    }
    if (before > 0 && readable.length === 0)
      warn(
        new GpuSourceError(
          'ERR_GPU_UNSUPPORTED',
          'GPU_SOURCE=nvml: no GPU is left to read (each one answers Not Supported); ' +
            'readings carry no GPU, the dispatcher runs without GPU input',
        ),
      );
    return readings;
  };
}

function readDevice(nvml: NvmlBinding, device: Device): GpuReading {
  const utilizationPercent = nvml.utilizationPercent(device.handle);
  const memory = nvml.memory(device.handle);
  return gpuReading('nvml', {
    index: device.index,
    uuid: device.uuid,
    utilizationPercent,
    memoryUsed: memory.used,
    memoryTotal: memory.total,
  });
}

function close(nvml: NvmlBinding) {
  try {
    nvml.shutdown();
  } finally {
    nvml.unload();
  }
}
