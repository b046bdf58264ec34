import { SMI_SETTLE_MS } from '../defaults.js';
import type { GpuReading } from '../types.js';

/**
 * Groups nvidia-smi's lines into one sample of every GPU. A sample is complete when it has
 * as many GPU lines as the previous complete one, when a GPU index repeats (the next sample
 * began), or SMI_SETTLE_MS after its last line. A sample with a bad line is dropped whole.
 * The line of a GPU the source leaves out (`leftOut`) counts as a line of the sample, but the
 * sample carries only the readings: a sample of left-out GPUs alone carries none.
 */
export interface SmiBatches {
  reading(reading: GpuReading): void;
  /** A line of a GPU left out of the readings (one that cannot report them). */
  leftOut(index: number): void;
  badLine(): void;
  /** Forgets a half-read sample (the process ended mid-sample). */
  reset(): void;
}

export function createSmiBatches(onSample: (gpus: GpuReading[]) => void): SmiBatches {
  let readings: GpuReading[] = [];
  /** The index of every GPU line of the sample, readings and left-out GPUs alike. */
  let indexes: number[] = [];
  let bad = false;
  let expected: number | undefined;
  let settle: NodeJS.Timeout | undefined;

  function reset() {
    clearTimeout(settle);
    settle = undefined;
    readings = [];
    indexes = [];
    bad = false;
  }

  function flush() {
    const gpus = readings;
    const lines = indexes.length;
    const complete = !bad && lines > 0;
    reset();
    if (!complete) return;
    expected = lines;
    onSample(gpus.sort((a, b) => a.index - b.index));
  }

  function wait() {
    clearTimeout(settle);
    settle = setTimeout(flush, SMI_SETTLE_MS);
    settle.unref();
  }

  function line(index: number, reading?: GpuReading) {
    if (indexes.includes(index)) flush();
    indexes.push(index);
    if (reading) readings.push(reading);
    if (!bad && indexes.length === expected) flush();
    else wait();
  }

  return {
    reading: (reading) => line(reading.index, reading),
    leftOut: (index) => line(index),
    badLine() {
      bad = true;
      wait();
    },
    reset,
  };
}
