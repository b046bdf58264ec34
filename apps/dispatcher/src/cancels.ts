// Cancel requests from gateways. A cancel can arrive before its job is released (the job
// was taken while the gateway was removing it): such ids are remembered for a while and
// checked at release.

export class CancelBook {
  private readonly running = new Map<string, AbortController>();
  private readonly early = new Map<string, number>();

  constructor(
    private readonly rememberMs: number,
    private readonly now: () => number,
  ) {}

  /** Registers a running job; returns undefined when it was cancelled already. */
  register(jobId: string): AbortController | undefined {
    if (this.early.delete(jobId)) return undefined;
    const controller = new AbortController();
    this.running.set(jobId, controller);
    return controller;
  }

  unregister(jobId: string): void {
    this.running.delete(jobId);
  }

  cancel(jobId: string, reason: string): boolean {
    const controller = this.running.get(jobId);
    if (controller) {
      controller.abort(new CancelledError(reason));
      return true;
    }
    this.early.set(jobId, this.now() + this.rememberMs);
    if (this.early.size > 10_000) this.prune();
    return false;
  }

  prune(): void {
    const now = this.now();
    for (const [id, until] of this.early) if (until <= now) this.early.delete(id);
  }
}

export class CancelledError extends Error {
  readonly code = 'ERR_SLUICE_CANCELLED';
}
