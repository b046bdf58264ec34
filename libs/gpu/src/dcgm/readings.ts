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
 * Labels dcgm-exporter puts on the series of a MIG GPU instance (one series per instance,
 * several per GPU). Device-level utilization does not exist under MIG, so such a GPU is left
 * out, as the NVML and nvidia-smi sources leave it out.
 */
const MIG_LABELS = ['GPU_I_ID', 'GPU_I_PROFILE'];

/**
 * The GPUs of one dcgm-exporter exposition, ordered by index. A GPU is identified by the `gpu`
 * label of its `DCGM_FI_DEV_GPU_UTIL` samples (the NVML index) and their `UUID`; its
 * `DCGM_FI_DEV_FB_USED` / `_FREE` samples are the ones with the same `gpu` and `UUID`. Other
 * labels (`modelName`, `DCGM_FI_DRIVER_VERSION`, and the Kubernetes pod mapping: `pod`,
 * `namespace`, `container`, `vgpu`…) are ignored.
 *
 * One GPU may have several samples: with pod mapping on, dcgm-exporter writes one series per
 * pod that uses the GPU (time slicing, MPS; NVIDIA/dcgm-exporter#340), each a copy of the
 * device's value that differs only in those labels. They are one GPU. Should the copies differ,
 * the highest utilization counts (the degradation signal errs towards busy), and memory is read
 * from the first matching series. A GPU with series of MIG GPU instances (`GPU_I_ID`, `GPU_I_PROFILE`)
 * is left out of the readings, and `onMig` told its index (each call); two UUIDs for one `gpu`
 * are refused.
 *
 * Framebuffer values are MiB. Total = used + free, plus `DCGM_FI_DEV_FB_RESERVED` when the
 * exporter's counters include it (DCGM 3.1+ then leaves the reserved part out of "used").
 * Throws ERR_GPU_PARSE when the text does not parse, names no GPU, mixes hosts, or a GPU
 * lacks a metric: a partial reading would read as a smaller machine.
 */
export function dcgmReadings(
  text: string,
  onMig: (index: number, detail: string) => void = () => {},
): GpuReading[] {
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

  // Each GPU's samples: one, or one per pod that shares it.
  const gpus = new Map<number, { gpu: string; uuid: string | undefined; percent: number }>();
  const migs = new Map<number, string>();
  for (const sample of utilization) {
    const gpu = sample.labels.gpu;
    if (gpu === undefined || !/^\d+$/.test(gpu))
      throw parseError(`${UTIL} sample without a gpu label`);
    const index = Number(gpu);
    const mig = MIG_LABELS.find((label) => sample.labels[label] !== undefined);
    if (mig !== undefined) {
      if (!migs.has(index)) migs.set(index, `${mig}="${sample.labels[mig]}"`);
      continue;
    }
    const uuid = sample.labels.UUID;
    const seen = gpus.get(index);
    if (seen === undefined) gpus.set(index, { gpu, uuid, percent: sample.value });
    else if (seen.uuid !== uuid)
      throw parseError(`GPU ${index} has ${UTIL} samples of two UUIDs, ${seen.uuid} and ${uuid}`);
    // NaN fails either way: Math.max keeps it, and gpuReading refuses it.
    else seen.percent = Math.max(seen.percent, sample.value);
  }

  for (const [index, detail] of migs) {
    gpus.delete(index);
    onMig(index, `${UTIL} per GPU instance, ${detail}`);
  }
  const readings = [...gpus].map(([index, { gpu, uuid, percent }]) => {
    const match: Record<string, string> = { gpu };
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
      utilizationPercent: percent,
      memoryUsed: used * MIB,
      memoryTotal: (used + free + reserved) * MIB,
    });
  });
  return readings.sort((a, b) => a.index - b.index);
}
