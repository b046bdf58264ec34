import { SMI_SETTLE_MS } from '../defaults.js';
import type { GpuReading } from '../types.js';

/**
 * Groups nvidia-smi's lines into one sample of every GPU. A sample is complete when it has
 * as many GPUs as the previous complete one, when a GPU index repeats (the next sample
 * began), or SMI_SETTLE_MS after its last line. A sample with a bad line is dropped whole.
 */
export interface SmiBatches {
  reading(reading: GpuReading): void;
  badLine(): void;
  /** Forgets a half-read sample (the process ended mid-sample). */
  reset(): void;
}

export function createSmiBatches(onSample: (gpus: GpuReading[]) => void): SmiBatches {
  let batch: GpuReading[] = [];
  let bad = false;
  let expected: number | undefined;
  let settle: NodeJS.Timeout | undefined;

  function reset() {
    clearTimeout(settle);
    settle = undefined;
    batch = [];
    bad = false;
  }

  function flush() {
    const gpus = batch;
    const complete = !bad && gpus.length > 0;
    reset();
    if (!complete) return;
    expected = gpus.length;
    onSample(gpus.sort((a, b) => a.index - b.index));
  }

  function wait() {
    clearTimeout(settle);
    settle = setTimeout(flush, SMI_SETTLE_MS);
    settle.unref();
  }

  return {
    reading(reading) {
      if (batch.some((gpu) => gpu.index === reading.index)) flush();
      batch.push(reading);
      if (!bad && batch.length === expected) flush();
      else wait();
    },
    badLine() {
      bad = true;
      wait();
    },
    reset,
  };
}
