// Cancel requests from gateways. A cancel can arrive before its job is released (the job
// was taken while the gateway was removing it): such ids are remembered for a while and
// checked at release. A cancel names the reason code its client hears, if anyone still
// listens (`cancelled` for a client that went, `dispatcher_lost` for a job whose lock this
// dispatcher lost).
import type { RejectReason } from '@sluice/protocol';

export class CancelBook {
  private readonly running = new Map<string, AbortController>();
  private readonly early = new Map<string, { until: number; error: CancelledError }>();

  constructor(
    private readonly rememberMs: number,
    private readonly now: () => number,
  ) {}

  /** Registers a running job; its controller is aborted already when it was cancelled before. */
  register(jobId: string): AbortController {
    const controller = new AbortController();
    const early = this.early.get(jobId);
    if (early) {
      this.early.delete(jobId);
      controller.abort(early.error);
      return controller;
    }
    this.running.set(jobId, controller);
    return controller;
  }

  unregister(jobId: string): void {
    this.running.delete(jobId);
  }

  cancel(jobId: string, reason: string, frameCode: RejectReason = 'cancelled'): boolean {
    const error = new CancelledError(reason, frameCode);
    const controller = this.running.get(jobId);
    if (controller) {
      if (!controller.signal.aborted) controller.abort(error);
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
