import { MIB } from '../defaults.js';
import { GpuSourceError } from '../errors.js';
import { gpuReading } from '../reading.js';
import type { GpuReading } from '../types.js';

/** The query every line answers, in this order. */
export const SMI_FIELDS = ['index', 'uuid', 'utilization.gpu', 'memory.used', 'memory.total'];

/** The arguments of the one long-lived nvidia-smi process: a CSV line per GPU every `pollMs`. */
export function nvidiaSmiArgs(pollMs: number): string[] {
  return [
    `--query-gpu=${SMI_FIELDS.join(',')}`,
    '--format=csv,noheader,nounits',
    '-lms',
    String(pollMs),
  ];
}

/**
 * One line of that output, e.g. `0, GPU-5f6b…, 37, 20480, 81559` (memory in MiB). Values
 * nvidia-smi cannot give come as `[N/A]` or `[Not Supported]` and make the line an error.
 */
export function parseSmiLine(line: string): GpuReading {
  const bad = (detail: string) =>
    new GpuSourceError('ERR_GPU_PARSE', `GPU_SOURCE=nvidia-smi: ${detail} in line "${line}"`);
  const fields = line.split(',').map((field) => field.trim());
  if (fields.length !== SMI_FIELDS.length)
    throw bad(`expected ${SMI_FIELDS.length} fields (${SMI_FIELDS.join(', ')})`);
  const number = (position: number) => {
    const text = fields[position]!;
    if (!/^\d+(\.\d+)?$/.test(text)) throw bad(`${SMI_FIELDS[position]} is ${text || 'empty'}`);
    return Number(text);
  };
  return gpuReading('nvidia-smi', {
    index: number(0),
    uuid: fields[1]!,
    utilizationPercent: number(2),
    memoryUsed: number(3) * MIB,
    memoryTotal: number(4) * MIB,
  });
}
