export { createGpuSource, GPU_SOURCE_KINDS } from './create.js';
export { DCGM_TIMEOUT_MS, POLL_MS } from './defaults.js';
export { GpuSourceError, NvmlError, type GpuErrorCode } from './errors.js';
export { dcgmReadings } from './dcgm/readings.js';
export { nvidiaSmiArgs, parseSmiLine } from './nvidia-smi/csv.js';
export { mockUtilization } from './mock.js';
export type {
  GpuReading,
  GpuSnapshot,
  GpuSource,
  GpuSourceKind,
  GpuSourceOptions,
  MockOptions,
} from './types.js';
