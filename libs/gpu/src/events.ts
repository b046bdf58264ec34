import type { GpuSnapshot } from './types.js';

/**
 * The two event lists every source keeps. Unlike Node's EventEmitter, an 'error' with no
 * listener is dropped rather than thrown: a failed reading is routine, the source keeps
 * trying, and the age of `latest().at` already tells the caller.
 */
export interface SourceEvents {
  on(event: 'snapshot', cb: (s: GpuSnapshot) => void): void;
  on(event: 'error', cb: (e: Error) => void): void;
  snapshot(s: GpuSnapshot): void;
  error(e: Error): void;
}

export function createSourceEvents(): SourceEvents {
  const snapshots: ((s: GpuSnapshot) => void)[] = [];
  const errors: ((e: Error) => void)[] = [];
  return {
    on(event: 'snapshot' | 'error', cb: ((s: GpuSnapshot) => void) | ((e: Error) => void)) {
      if (event === 'snapshot') snapshots.push(cb as (s: GpuSnapshot) => void);
      else if (event === 'error') errors.push(cb as (e: Error) => void);
      else throw new TypeError(`unknown GPU source event ${String(event)}`);
    },
    snapshot(s) {
      for (const cb of snapshots) cb(s);
    },
    error(e) {
      for (const cb of errors) cb(e);
    },
  };
}
