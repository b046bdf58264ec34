// The GPU reading, if a source is configured: exported as metrics, and a new reading wakes
// the release loops (the load signal of degradation reads it). A source that cannot work
// here (no NVML library, no nvidia-smi) is one clear log line; the dispatcher runs on.
import type { SluiceConfig } from '@sluice/config';
import { createGpuSource, type GpuSource } from '@sluice/gpu';
import type { DispatcherMetrics } from '@sluice/observability';

export async function startGpu(
  config: SluiceConfig['gpu'],
  metrics: DispatcherMetrics,
  onReading: () => void,
  log: {
    info(o: object, m: string): void;
    error(o: object, m: string): void;
    warn(o: object, m: string): void;
  },
): Promise<GpuSource | undefined> {
  const source = createGpuSource({
    source: config.source,
    ...(config.dcgmUrl ? { dcgmUrl: config.dcgmUrl } : {}),
  });
  if (!source) return undefined;
  source.on('snapshot', (snapshot) => {
    for (const gpu of snapshot.gpus) {
      const labels = { gpu: String(gpu.index) };
      metrics.gpuUtilization.set(labels, gpu.utilization);
      metrics.gpuMemoryUsed.set(labels, gpu.memoryUsed);
      metrics.gpuMemoryTotal.set(labels, gpu.memoryTotal);
    }
    onReading();
  });
  source.on('error', (err) => log.warn({ err: err.message }, 'GPU reading failed'));
  try {
    await source.start();
    log.info({ source: config.source }, 'GPU source started');
    return source;
  } catch (err) {
    log.error({ err: (err as Error).message }, 'GPU source unavailable: running without GPU input');
    return undefined;
  }
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
