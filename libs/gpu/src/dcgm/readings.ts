import { parseExposition, sampleValue, type Exposition } from '@sluice/engine-metrics';
import { MIB } from '../defaults.js';
import { GpuSourceError, messageOf } from '../errors.js';
import { gpuReading } from '../reading.js';
import type { GpuReading } from '../types.js';

const UTIL = 'DCGM_FI_DEV_GPU_UTIL';
const FB_USED = 'DCGM_FI_DEV_FB_USED';
const FB_FREE = 'DCGM_FI_DEV_FB_FREE';
const FB_RESERVED = 'DCGM_FI_DEV_FB_RESERVED';

function parseError(detail: string, cause?: unknown) {
  return new GpuSourceError('ERR_GPU_PARSE', `GPU_SOURCE=dcgm: ${detail}`, { cause });
}

/**
 * The GPUs of one dcgm-exporter exposition, ordered by index. One GPU per
 * `DCGM_FI_DEV_GPU_UTIL` sample, identified by its `gpu` label (the NVML index) and `UUID`;
 * its `DCGM_FI_DEV_FB_USED` / `_FREE` samples are the ones with the same `gpu` and `UUID`
 * (other labels, such as `pod`, `modelName` or `DCGM_FI_DRIVER_VERSION`, are ignored).
 * Framebuffer values are MiB. Total = used + free, plus `DCGM_FI_DEV_FB_RESERVED` when the
 * exporter's counters include it (DCGM 3.1+ then leaves the reserved part out of "used").
 * Throws ERR_GPU_PARSE when the text does not parse, names no GPU, mixes hosts, or a GPU
 * lacks a metric: a partial reading would read as a smaller machine.
 */
export function dcgmReadings(text: string): GpuReading[] {
  let exposition: Exposition;
  try {
    exposition = parseExposition(text);
  } catch (error) {
    throw parseError(`exposition does not parse: ${messageOf(error)}`, error);
  }
  const utilization = exposition.samples.filter((s) => s.name === UTIL);
  if (utilization.length === 0)
    throw parseError(`no ${UTIL} samples (is ${UTIL} in the exporter's counters CSV?)`);

  const hosts = new Set(utilization.map((s) => s.labels.Hostname).filter((h) => h !== undefined));
  if (hosts.size > 1)
    throw parseError(
      `exposition mixes hosts ${[...hosts].join(', ')}; point DCGM_URL at one node's exporter`,
    );

  const seen = new Set<number>();
  const readings = utilization.map((sample) => {
    const gpu = sample.labels.gpu;
    if (gpu === undefined || !/^\d+$/.test(gpu))
      throw parseError(`${UTIL} sample without a gpu label`);
    const index = Number(gpu);
    if (seen.has(index))
      throw parseError(`GPU ${index} has two ${UTIL} samples (MIG instances are not supported)`);
    seen.add(index);
    const match: Record<string, string> = { gpu };
    const uuid = sample.labels.UUID;
    if (uuid !== undefined) match.UUID = uuid;
    const mib = (name: string) => {
      const value = sampleValue(exposition, name, match);
      if (value === undefined) throw parseError(`GPU ${index} has no ${name} sample`);
      return value;
    };
    const used = mib(FB_USED);
    const free = mib(FB_FREE);
    const reserved = sampleValue(exposition, FB_RESERVED, match) ?? 0;
    return gpuReading('dcgm', {
      index,
      uuid,
      utilizationPercent: sample.value,
      memoryUsed: used * MIB,
      memoryTotal: (used + free + reserved) * MIB,
    });
  });
  return readings.sort((a, b) => a.index - b.index);
}
