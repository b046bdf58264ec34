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

/** What nvidia-smi prints for a value a GPU cannot give (utilization of a MIG-enabled GPU). */
const UNSUPPORTED = new Set(['[N/A]', '[Not Supported]']);

/** One line of that output: a GPU's reading, or a GPU that cannot give one of the values. */
export type SmiLine =
  | { reading: GpuReading }
  | { unsupported: { index: number; uuid: string; field: string; value: string } };

/**
 * One line of that output, e.g. `0, GPU-5f6b…, 37, 20480, 81559` (memory in MiB). A value
 * nvidia-smi cannot give (`[N/A]`, `[Not Supported]`: utilization on a MIG-enabled GPU) makes
 * the line `unsupported`: that GPU, not a broken line. Anything else unusable throws
 * ERR_GPU_PARSE.
 */
export function smiLine(line: string): SmiLine {
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
  const index = number(0);
  const uuid = fields[1]!;
  for (const position of [2, 3, 4]) {
    if (UNSUPPORTED.has(fields[position]!))
      return {
        unsupported: { index, uuid, field: SMI_FIELDS[position]!, value: fields[position]! },
      };
  }
  return {
    reading: gpuReading('nvidia-smi', {
      index,
      uuid,
      utilizationPercent: number(2),
      memoryUsed: number(3) * MIB,
      memoryTotal: number(4) * MIB,
    }),
  };
}

/**
 * One line of that output as a reading. Values nvidia-smi cannot give come as `[N/A]` or
 * `[Not Supported]` and make the line an error here (the source leaves that GPU out instead).
 */
export function parseSmiLine(line: string): GpuReading {
  const parsed = smiLine(line);
  if ('reading' in parsed) return parsed.reading;
  const { field, value } = parsed.unsupported;
  throw new GpuSourceError(
    'ERR_GPU_PARSE',
    `GPU_SOURCE=nvidia-smi: ${field} is ${value} in line "${line}"`,
  );
}
