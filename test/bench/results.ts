// What every scenario writes: one JSON file per scenario under bench/results/, read by the
// report writer (numbers only; the report decides how to show them), and the few measuring
// helpers the scenarios share.
import { execFileSync } from 'node:child_process';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { repoRoot } from '../support/index.ts';

export interface Figure {
  name: string;
  value: number;
  unit: string;
  /** The goal from the issue, in words (`added p50 <= 1 ms`). */
  goal?: string;
  met?: boolean;
  note?: string;
}

export interface Series {
  name: string;
  unit: string;
  /** [seconds, value] */
  points: Array<[number, number]>;
}

export interface ScenarioResult {
  scenario: string;
  title: string;
  figures: Figure[];
  series?: Series[];
  /** Repeated runs of one figure: how noisy it is. */
  runs?: { n: number; min: number; median: number; max: number; unit: string; of: string }[];
  notes?: string[];
  /** Tables a figure list would not show well (a per-stage breakdown). */
  tables?: { title: string; head: string[]; rows: string[][] }[];
  /** Where a goal was missed: what limits it, as measured (shown in the summary too). */
  bottleneck?: string;
  /**
   * The headline in words, a sentence each (a goal's verdict with its ratio, and why where it
   * was missed): listed under the comparison table in the report, and in the summary.
   */
  findings?: string[];
}

export const resultsDir = join(repoRoot, 'bench', 'results');

export function writeResult(result: ScenarioResult): void {
  mkdirSync(resultsDir, { recursive: true });
  writeFileSync(
    join(resultsDir, `${result.scenario}.json`),
    `${JSON.stringify(result, null, 2)}\n`,
  );
}

/** The nearest-rank quantile of ascending `sorted` (NaN when empty). */
export function quantile(sorted: number[], q: number): number {
  if (sorted.length === 0) return Number.NaN;
  const rank = Math.ceil(q * sorted.length);
  return sorted[Math.min(sorted.length - 1, Math.max(0, rank - 1))]!;
}

export function summarize(values: number[]): {
  min: number;
  median: number;
  max: number;
  p50: number;
  p99: number;
} {
  const sorted = [...values].sort((a, b) => a - b);
  const p50 = quantile(sorted, 0.5);
  return {
    min: sorted[0] ?? Number.NaN,
    median: p50,
    max: sorted.at(-1) ?? Number.NaN,
    p50,
    p99: quantile(sorted, 0.99),
  };
}

/** `value` rounded to `digits` decimals, for figures that should not carry timer noise. */
export function round(value: number, digits = 3): number {
  const f = 10 ** digits;
  return Math.round(value * f) / f;
}

const clockTicks = Number(execFileSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }));

/** CPU seconds a process has used so far, all threads, user + system (Linux /proc). */
export function cpuSeconds(pid: number): number {
  // Fields after the command name: utime and stime are the 12th and 13th.
  const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ');
  return (Number(fields[11]) + Number(fields[12])) / clockTicks;
}

/** Resident memory of a process in bytes (VmRSS, Linux /proc). */
export function residentBytes(pid: number): number {
  const match = /^VmRSS:\s+(\d+) kB/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  if (!match) throw new Error(`no VmRSS for process ${pid}`);
  return Number(match[1]) * 1024;
}
