import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { GpuSnapshot, GpuSource } from '../src/index.ts';

/** Every event a source emitted, and promises for the next ones. */
export interface Recorder {
  readonly snapshots: GpuSnapshot[];
  readonly errors: Error[];
  readonly warnings: Error[];
  nextSnapshot(timeoutMs?: number): Promise<GpuSnapshot>;
  nextError(timeoutMs?: number): Promise<Error>;
}

export function record(source: GpuSource): Recorder {
  const snapshots: GpuSnapshot[] = [];
  const errors: Error[] = [];
  const warnings: Error[] = [];
  const waiting = {
    snapshot: [] as ((s: GpuSnapshot) => void)[],
    error: [] as ((e: Error) => void)[],
  };
  source.on('snapshot', (s) => {
    snapshots.push(s);
    for (const resolve of waiting.snapshot.splice(0)) resolve(s);
  });
  source.on('error', (e) => {
    errors.push(e);
    for (const resolve of waiting.error.splice(0)) resolve(e);
  });
  source.on('warning', (w) => warnings.push(w));
  function next<T>(list: ((v: T) => void)[], what: string, timeoutMs: number) {
    return new Promise<T>((resolve, reject) => {
      const timer = setTimeout(
        () =>
          reject(
            new Error(
              `no ${what} within ${timeoutMs} ms; errors so far: ${errors.map((e) => e.message).join(' | ')}`,
            ),
          ),
        timeoutMs,
      );
      list.push((value) => {
        clearTimeout(timer);
        resolve(value);
      });
    });
  }
  return {
    snapshots,
    errors,
    warnings,
    nextSnapshot: (timeoutMs = 5000) => next(waiting.snapshot, 'snapshot', timeoutMs),
    nextError: (timeoutMs = 5000) => next(waiting.error, 'error', timeoutMs),
  };
}

/** A fresh temporary directory and its removal. */
export function tempDir(prefix: string): { path: string; remove(): void } {
  const path = mkdtempSync(join(tmpdir(), `sluice-gpu-${prefix}-`));
  return { path, remove: () => rmSync(path, { recursive: true, force: true }) };
}

export const GiB = 1024 ** 3;
export const MiB = 1024 ** 2;
