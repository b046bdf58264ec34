/** Why a GPU source failed. */
export type GpuErrorCode =
  /** Bad options given to `createGpuSource`. */
  | 'ERR_GPU_OPTIONS'
  /** The NVML shared library (or one of its functions) could not be loaded. */
  | 'ERR_GPU_LIBRARY'
  /** An NVML function returned something other than NVML_SUCCESS. */
  | 'ERR_GPU_NVML'
  /** The DCGM exporter could not be reached, or answered with an error status. */
  | 'ERR_GPU_SCRAPE'
  /** A reading arrived but did not say what it must (bad exposition, bad CSV line). */
  | 'ERR_GPU_PARSE'
  /** nvidia-smi could not be started, or exited. */
  | 'ERR_GPU_PROCESS'
  /** A reading failed for a reason none of the above covers. */
  | 'ERR_GPU_READ'
  /** A GPU left out of the readings because it cannot report them ('warning' events only). */
  | 'ERR_GPU_UNSUPPORTED';

/** Every error a GPU source rejects with or emits. The message is always one line. */
export class GpuSourceError extends Error {
  readonly code: GpuErrorCode;

  constructor(code: GpuErrorCode, message: string, options?: { cause?: unknown }) {
    super(oneLine(message), options);
    this.name = 'GpuSourceError';
    this.code = code;
  }
}

/** An NVML call that returned an error code. */
export class NvmlError extends GpuSourceError {
  /** The NVML function that failed, e.g. `nvmlDeviceGetUtilizationRates`. */
  readonly function: string;
  /** Its `nvmlReturn_t`. */
  readonly nvmlReturn: number;

  constructor(fn: string, nvmlReturn: number, text: string) {
    super('ERR_GPU_NVML', `GPU_SOURCE=nvml: ${fn} failed: ${text} (nvmlReturn_t ${nvmlReturn})`);
    this.name = 'NvmlError';
    this.function = fn;
    this.nvmlReturn = nvmlReturn;
  }
}

/** Folds any whitespace run that contains a line break into one space. */
export function oneLine(text: string): string {
  return text.replace(/\s*[\r\n]+\s*/g, ' ').trim();
}

/** The message of anything thrown, on one line. */
export function messageOf(error: unknown): string {
  return oneLine(error instanceof Error ? error.message : String(error));
}
