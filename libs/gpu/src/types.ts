/** One GPU as a source last read it. */
export interface GpuReading {
  /** The driver's index (NVML / nvidia-smi order, PCI bus order; DCGM's `gpu` label). */
  index: number;
  /** `GPU-…` UUID where the source reports one. */
  uuid?: string;
  /** Busy fraction, 0..1 (NVML's "percent of time a kernel was running" / 100). */
  utilization: number;
  /** Framebuffer memory in use, bytes. */
  memoryUsed: number;
  /** Framebuffer memory size, bytes. */
  memoryTotal: number;
}

/** Every GPU of one reading, stamped by the injected clock when the reading completed. */
export interface GpuSnapshot {
  /** Unix ms, from the source's `now()`. */
  at: number;
  gpus: GpuReading[];
}

export type GpuSourceKind = 'none' | 'nvml' | 'dcgm' | 'nvidia-smi' | 'mock';

export interface GpuSource {
  readonly kind: string;
  /** Latest snapshot, or undefined before the first successful read. */
  latest(): GpuSnapshot | undefined;
  /**
   * Begins reading. Resolves once the first reading has been attempted; rejects (with one
   * line) only when the source cannot work at all here: the NVML library does not load,
   * nvmlInit fails, nvidia-smi cannot run or exits before its first reading.
   */
  start(): Promise<void>;
  /** Stops reading and releases what `start()` acquired; no events afterwards. */
  stop(): Promise<void>;
  /** Every new reading. */
  on(event: 'snapshot', cb: (s: GpuSnapshot) => void): void;
  /** A failed reading (one line). The source keeps its last snapshot and keeps trying. */
  on(event: 'error', cb: (e: Error) => void): void;
  /**
   * Said once, not per poll (one line, code ERR_GPU_UNSUPPORTED): a GPU that cannot report
   * what a reading needs (NVML's Not Supported, nvidia-smi's `[N/A]`, e.g. a MIG-enabled GPU)
   * is left out of every
   * reading from now on; when no GPU is left, readings carry no GPU.
   */
  on(event: 'warning', cb: (e: Error) => void): void;
}

export interface MockOptions {
  /** Length of one sine period, ms. */
  periodMs?: number;
  /** Lowest utilization, 0..1. */
  min?: number;
  /** Highest utilization, 0..1. */
  max?: number;
}

export interface GpuSourceOptions {
  source: GpuSourceKind;
  /** The DCGM exporter's metrics URL, e.g. http://dcgm-exporter:9400/metrics (`DCGM_URL`). */
  dcgmUrl?: string;
  /** How often to read, ms. */
  pollMs?: number;
  /** Clock for snapshot stamps (and the mock's curve). */
  now?: () => number;
  /** NVML shared library to load (tests point this at a stand-in). */
  libraryPath?: string;
  /** The nvidia-smi executable. */
  nvidiaSmiPath?: string;
  mock?: MockOptions;
}
