// Cancel requests from gateways. A cancel can arrive before its job is released (the job
// was taken while the gateway was removing it, or is held back): such ids are remembered for
// as long as a job can wait before its release, and checked at release. A cancel names the
// reason code its client hears, if anyone still listens (`cancelled` for a client that went,
// `dispatcher_lost` for a job whose lock this dispatcher lost).
import type { RejectReason } from '@sluice/protocol';
import { longestWaitMs } from './holding.js';
import { IdTable } from './id-table.js';

/**
 * How long a cancel for a job not running is remembered: as long as a job of any of `pools`
 * can wait before its release. A held long prompt may be released at its park limit; a cancel
 * forgotten before that would let it run for a client that left.
 */
export function earlyCancelMs(pools: readonly { maxParkSeconds: number }[]): number {
  return Math.max(0, ...pools.map((p) => longestWaitMs(p.maxParkSeconds)));
}

export class CancelBook {
  /** Not a Map: see id-table.ts. */
  private readonly running = new IdTable<Cancellation>();
  private readonly early = new Map<string, { until: number; error: CancelledError }>();

  constructor(
    private readonly rememberMs: number,
    private readonly now: () => number,
  ) {}

  /** Registers a running job; its cancellation is aborted already when it was cancelled before. */
  register(jobId: string): Cancellation {
    const cancellation = new Cancellation();
    const early = this.early.get(jobId);
    if (early) {
      this.early.delete(jobId);
      cancellation.abort(early.error);
      return cancellation;
    }
    this.running.set(jobId, cancellation);
    return cancellation;
  }

  unregister(jobId: string): void {
    this.running.delete(jobId);
  }

  cancel(jobId: string, reason: string, frameCode: RejectReason = 'cancelled'): boolean {
    const error = new CancelledError(reason, frameCode);
    const cancellation = this.running.get(jobId);
    if (cancellation) {
      cancellation.abort(error);
      return true;
    }
    this.early.set(jobId, { until: this.now() + this.rememberMs, error });
    if (this.early.size > 10_000) this.prune();
    return false;
  }

  prune(): void {
    const now = this.now();
    for (const [id, { until }] of this.early) if (until <= now) this.early.delete(id);
  }
}

/**
 * One running job's cancellation: aborted at most once, with a reason, and one listener (the
 * engine call's). Not an AbortController: Node tracks each AbortSignal weakly, and V8's
 * young-generation collector keeps weakly tracked objects alive, so every job's signal, and
 * what its listener reached, was promoted to the old generation. Measured on Node 20 with
 * `--trace-gc-nvp`, 300,000 signals made and dropped: 2.2-2.9 MB promoted and 7.7-9.6 ms
 * per young-generation pause, against 0.09 MB and 0.9 ms for as many plain objects
 * (docs/performance.md, "Garbage per request").
 */
export class Cancellation {
  private why: CancelledError | undefined;
  private listener: ((why: CancelledError) => void) | undefined;

  get aborted(): boolean {
    return this.why !== undefined;
  }

  /** Why it was cancelled; undefined while it was not. */
  get reason(): CancelledError | undefined {
    return this.why;
  }

  /** Cancels, once: a second abort keeps the first reason. */
  abort(why: CancelledError): void {
    if (this.why) return;
    this.why = why;
    const listener = this.listener;
    this.listener = undefined;
    listener?.(why);
  }

  /** Runs `listener` at the abort, in place of any before; answers a function that removes it. */
  onAbort(listener: (why: CancelledError) => void): () => void {
    this.listener = listener;
    return () => {
      if (this.listener === listener) this.listener = undefined;
    };
  }
}

export class CancelledError extends Error {
  readonly code = 'ERR_SLUICE_CANCELLED';

  constructor(
    message: string,
    /** The code of the error frame its client gets. */
    readonly frameCode: RejectReason = 'cancelled',
  ) {
    super(message);
  }
}
