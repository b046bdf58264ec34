// The GPU reading, if a source is configured: exported as metrics, and a new reading wakes
// the release loops (the load signal of degradation reads it). A source that cannot work
// here (no NVML library, no nvidia-smi) is one clear log line; the dispatcher runs on. A
// source that keeps failing is one warn line per kind of failure and 10 s, not one per poll.
// The GPU series are exported only while the latest reading is young enough for the load
// signal (checked at each collection, as leader-metrics.ts filters the pool gauges): a
// dashboard must not show the last good reading of a source that is broken or gone silent,
// whether or not it says so with an error.
import type { SluiceConfig } from '@sluice/config';
import { createGpuSource, DCGM_TIMEOUT_MS, POLL_MS, type GpuSource } from '@sluice/gpu';
import type { DispatcherMetrics } from '@sluice/observability';
import { limitedWarn } from './warn-limit.js';

export async function startGpu(
  config: SluiceConfig['gpu'],
  metrics: DispatcherMetrics,
  /** How old a reading may be and still count (`gpuMaxAgeMs`). */
  maxAgeMs: number,
  onReading: () => void,
  log: {
    info(o: object, m: string): void;
    error(o: object, m: string): void;
    warn(o: object, m: string): void;
  },
  /** The clock of the readings' `at` and of their age. */
  now: () => number = Date.now,
): Promise<GpuSource | undefined> {
  const source = createGpuSource({
    source: config.source,
    pollMs: POLL_MS, // gpuMaxAgeMs counts on this period
    now,
    ...(config.dcgmUrl ? { dcgmUrl: config.dcgmUrl } : {}),
  });
  if (!source) return undefined;
  const gauges = [metrics.gpuUtilization, metrics.gpuMemoryUsed, metrics.gpuMemoryTotal];
  const clear = () => gauges.forEach((g) => g.reset());
  // No series while the latest reading does not count for the load signal either (none yet,
  // or older than maxAgeMs): a source that hangs without an error, or keeps failing.
  for (const gauge of gauges) {
    const collect = gauge.get.bind(gauge);
    gauge.get = async () => {
      const fresh = readingAge(source, now()) <= maxAgeMs;
      const all = await collect();
      return fresh ? all : { ...all, values: [] };
    };
  }
  source.on('snapshot', (snapshot) => {
    // A GPU left out of this reading (MIG enabled since, gone) must not keep its last values.
    clear();
    for (const gpu of snapshot.gpus) {
      const labels = { gpu: String(gpu.index) };
      metrics.gpuUtilization.set(labels, gpu.utilization);
      metrics.gpuMemoryUsed.set(labels, gpu.memoryUsed);
      metrics.gpuMemoryTotal.set(labels, gpu.memoryTotal);
    }
    onReading();
  });
  const warn = limitedWarn(log);
  source.on('error', (err) => warn('GPU reading failed', err));
  // Said once by the source (a GPU it leaves out of every reading, e.g. MIG-enabled).
  source.on('warning', (w) => log.warn({ err: w.message }, 'GPU left out of the readings'));
  try {
    await source.start();
    log.info({ source: config.source }, 'GPU source started');
    return source;
  } catch (err) {
    log.error({ err: (err as Error).message }, 'GPU source unavailable: running without GPU input');
    return undefined;
  }
}

/**
 * How old a GPU reading may be and still count: four scrape intervals, but never less than
 * the source's own cadence allows. The source reads every POLL_MS whatever
 * ENGINE_SCRAPE_INTERVAL_MS is, and a dcgm scrape may take up to DCGM_TIMEOUT_MS more, so a
 * fast scrape interval must not drop readings the source could not have made fresher.
 */
export function gpuMaxAgeMs(
  source: SluiceConfig['gpu']['source'],
  scrapeIntervalMs: number,
): number {
  const timeoutMs = source === 'dcgm' ? DCGM_TIMEOUT_MS : 0;
  return Math.max(4 * scrapeIntervalMs, 2 * POLL_MS + timeoutMs);
}

/** Age of the latest reading at `now`; Infinity before the first. */
function readingAge(source: GpuSource, now: number): number {
  const snapshot = source.latest();
  return snapshot ? now - snapshot.at : Infinity;
}

/** Highest utilization (0..1) of the latest reading, if one is younger than `maxAgeMs`. */
export function gpuUtilization(
  source: GpuSource | undefined,
  maxAgeMs: number,
  now = Date.now(),
): number | undefined {
  const snapshot = source?.latest();
  if (!snapshot || now - snapshot.at > maxAgeMs || snapshot.gpus.length === 0) return undefined;
  return Math.max(...snapshot.gpus.map((g) => g.utilization));
}
