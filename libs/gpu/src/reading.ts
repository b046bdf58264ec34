import { GpuSourceError } from './errors.js';
import type { GpuReading } from './types.js';

/**
 * Builds a reading from what a source reported, refusing values no GPU reports (a percent
 * outside 0..100, negative or non-finite memory): a bad reading is an error, never a guess.
 */
export function gpuReading(
  kind: string,
  fields: {
    index: number;
    uuid?: string;
    utilizationPercent: number;
    memoryUsed: number;
    memoryTotal: number;
  },
): GpuReading {
  const { index, uuid, utilizationPercent, memoryUsed, memoryTotal } = fields;
  const bad = (what: string, value: number) =>
    new GpuSourceError(
      'ERR_GPU_PARSE',
      `GPU_SOURCE=${kind}: GPU ${index} reports ${what} ${value}`,
    );
  if (!Number.isInteger(index) || index < 0) throw bad('index', index);
  if (!(utilizationPercent >= 0 && utilizationPercent <= 100))
    throw bad('utilization (percent)', utilizationPercent);
  if (!(Number.isFinite(memoryUsed) && memoryUsed >= 0)) throw bad('memory used', memoryUsed);
  if (!(Number.isFinite(memoryTotal) && memoryTotal >= 0)) throw bad('memory total', memoryTotal);
  const reading: GpuReading = {
    index,
    utilization: utilizationPercent / 100,
    memoryUsed,
    memoryTotal,
  };
  if (uuid !== undefined && uuid !== '') reading.uuid = uuid;
  return reading;
}
