// Every default of this package, in one place.

/** `pollMs` when none is given. */
export const POLL_MS = 1000;

/** The NVML library the dynamic loader looks up (the driver installs it with this soname). */
export const NVML_LIBRARY = 'libnvidia-ml.so.1';

/** Size of the buffer handed to nvmlDeviceGetUUID (NVML_DEVICE_UUID_V2_BUFFER_SIZE). */
export const NVML_UUID_BUFFER = 96;

/** The nvidia-smi executable, looked up on PATH. */
export const NVIDIA_SMI = 'nvidia-smi';

/** nvidia-smi restarts after an exit: first delay, doubled per failed run up to the maximum. */
export const RESTART_MIN_MS = 1000;
export const RESTART_MAX_MS = 30_000;

/** `start()` of nvidia-smi resolves after this long even without a first reading. */
export const FIRST_READING_TIMEOUT_MS = 5000;

/**
 * A DCGM scrape is abandoned after this long. Readings never overlap (the next is scheduled
 * pollMs after the previous one finished), so it need not shrink with pollMs, and a fast
 * poll does not turn a cold first connection into a failure.
 */
export const DCGM_TIMEOUT_MS = 1000;

/** Largest DCGM exposition read; a busy 8-GPU exporter writes well under 1 MiB. */
export const DCGM_MAX_BODY_BYTES = 8 * 1024 * 1024;

/** The mock's sinusoid: one period a minute sweeping 10 %..100 %, so every load state shows. */
export const MOCK_PERIOD_MS = 60_000;
export const MOCK_MIN = 0.1;
export const MOCK_MAX = 1;

/** The mock's one GPU: an 80 GiB card whose memory in use follows utilization. */
export const MOCK_MEMORY_TOTAL = 80 * 1024 ** 3;

export const MIB = 1024 * 1024;

/** nvidia-smi writes a sample's lines back to back; a sample ends this long after its last line. */
export const SMI_SETTLE_MS = 25;

/** After SIGTERM, nvidia-smi gets this long to exit before SIGKILL. */
export const SMI_KILL_AFTER_MS = 2000;

/**
 * nvidia-smi prints every pollMs; one that printed no line for this many poll intervals is
 * taken as hung (a wedged driver): reported, killed and started again.
 */
export const SMI_SILENT_POLLS = 5;

/**
 * Before its first line a process gets at least this long: nvidia-smi initialises NVML
 * first, which takes seconds on a cold driver (no persistence mode) with many GPUs.
 */
export const SMI_FIRST_LINE_MS = 30_000;
