import type { GpuSnapshot } from './types.js';

/**
 * The event lists every source keeps. Unlike Node's EventEmitter, an 'error' with no
 * listener is dropped rather than thrown: a failed reading is routine, the source keeps
 * trying, and the age of `latest().at` already tells the caller. A 'warning' is a fact
 * about the readings that stays true (a GPU left out of them), emitted once, not per poll.
 */
export interface SourceEvents {
  on(event: 'snapshot', cb: (s: GpuSnapshot) => void): void;
  on(event: 'error', cb: (e: Error) => void): void;
  on(event: 'warning', cb: (e: Error) => void): void;
  snapshot(s: GpuSnapshot): void;
  error(e: Error): void;
  warning(e: Error): void;
}

export function createSourceEvents(): SourceEvents {
  const snapshots: ((s: GpuSnapshot) => void)[] = [];
  const errors: ((e: Error) => void)[] = [];
  const warnings: ((e: Error) => void)[] = [];
  return {
    on(
      event: 'snapshot' | 'error' | 'warning',
      cb: ((s: GpuSnapshot) => void) | ((e: Error) => void),
    ) {
      if (event === 'snapshot') snapshots.push(cb as (s: GpuSnapshot) => void);
      else if (event === 'error') errors.push(cb as (e: Error) => void);
      else if (event === 'warning') warnings.push(cb as (e: Error) => void);
      else throw new TypeError(`unknown GPU source event ${String(event)}`);
    },
    snapshot(s) {
      for (const cb of snapshots) cb(s);
    },
    error(e) {
      for (const cb of errors) cb(e);
    },
    warning(e) {
      for (const cb of warnings) cb(e);
    },
  };
}
