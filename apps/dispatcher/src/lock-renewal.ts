// Keeps the BullMQ locks of the jobs in flight: every quarter of the lock's duration, one
// `extendJobLocks` for all of them. A lock that could not be extended (BullMQ returns the ids
// it failed for: the lock expired, or another token holds it) means the job is no longer
// this dispatcher's: the stalled check fails it, or another dispatcher took it. `lost` is
// told, once per job. A job whose outcome was already sent to BullMQ is never lost: the
// completion takes the lock with it, and on the same connection it may run before the
// extension while the ledger still holds the job (the completion's answer is still on its way
// through BullMQ's promises); its run has ended, so there is nothing to stop either.
import type { Worker } from 'bullmq';
import type { InflightJob, InflightLedger } from './ledger.js';

export interface LockRenewalDeps {
  worker: Pick<Worker, 'extendJobLocks'>;
  ledger: Pick<InflightLedger, 'values' | 'get'>;
  lockDurationMs: number;
  lost: (entry: InflightJob) => void;
  /** Redis did not answer: the locks may still hold; the next round tries again. */
  failed: (err: unknown) => void;
}

export class LockRenewal {
  private timer: NodeJS.Timeout | undefined;
  private readonly reported = new WeakSet<InflightJob>();

  constructor(private readonly deps: LockRenewalDeps) {}

  start(): void {
    const period = Math.max(100, Math.floor(this.deps.lockDurationMs / 4));
    this.timer = setInterval(() => void this.renew(), period);
  }

  stop(): void {
    clearInterval(this.timer);
  }

  /** One round; resolves when it is done, never rejects. */
  async renew(): Promise<void> {
    const entries = this.deps.ledger.values();
    if (entries.length === 0) return;
    let failedIds: string[];
    try {
      failedIds = await this.deps.worker.extendJobLocks(
        entries.map((e) => e.id),
        entries.map((e) => e.token),
        this.deps.lockDurationMs,
      );
    } catch (err) {
      this.deps.failed(err);
      return;
    }
    const failed = new Set(failedIds);
    for (const entry of entries) {
      if (!failed.has(entry.id) || entry.recorded) continue;
      // Ended while the call was on the wire (its lock went with it): nothing was lost.
      if (this.deps.ledger.get(entry.id) !== entry) continue;
      if (this.reported.has(entry)) continue;
      this.reported.add(entry);
      this.deps.lost(entry);
    }
  }
}
