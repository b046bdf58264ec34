// The mechanics of holding jobs back (the why is in held-jobs.ts, the choosing in
// `@sluice/admission`'s release order): moving a job to the delayed set and back, adopting a
// predecessor's held jobs, and dropping the ones whose client went.
import {
  classify,
  nextToPromote,
  withHeld,
  type OrderContext,
  type WaitReason,
} from '@sluice/admission';
import type { LongPromptConfig } from '@sluice/config';
import type { DispatcherMetrics } from '@sluice/observability';
import { validateJobPayload, type JobPayload } from '@sluice/protocol';
import type { Redis } from '@sluice/redis';
import type { Job, Queue } from 'bullmq';
import { HeldJobs, type HeldJob } from './held-jobs.js';
import { buildJob } from './job-build.js';

/** How long after its deadline BullMQ moves a held job back into the queue by itself. */
const HELD_GRACE_MS = 5000;

/**
 * The longest a job of a pool with this park limit can wait between its add and its release:
 * up to its deadline, queued or held back; a held job is back in the queue by its deadline
 * plus the grace, and one taken past its deadline is expired, never run.
 */
export function longestWaitMs(maxParkSeconds: number): number {
  return maxParkSeconds * 1000 + HELD_GRACE_MS;
}

export interface HoldingDeps {
  pool: string;
  queue: Queue;
  /** Command connection (existence checks). */
  redis: Redis;
  metrics: DispatcherMetrics;
  log: { info(o: object, m: string): void; warn(o: object, m: string): void };
  longPrompts: LongPromptConfig;
  isLeader: () => boolean;
  /** The engines and policies the release order reads, at `now`. */
  context: (now: number) => Omit<OrderContext, 'held'>;
  /** The held set changed: the release loop and the gate may look again. */
  changed: () => void;
  now: () => number;
}

export class Holding {
  readonly held = new HeldJobs();

  constructor(private readonly deps: HoldingDeps) {}

  /** The release order's view, held jobs included. */
  context(now: number): OrderContext {
    return withHeld(this.deps.context(now), this.held.ordered());
  }

  /** A job the loop took back (after a promotion, or BullMQ's own move at its deadline). */
  taken(jobId: string): void {
    if (this.held.remove(jobId)) this.setMetrics();
  }

  /** The leadership ended: the jobs stay in the delayed set for the next leader to adopt. */
  forget(): void {
    this.held.clear();
    this.setMetrics();
  }

  /** Moves a taken job to the delayed set until it may go (see held-jobs.ts). */
  async hold(
    job: Job,
    token: string,
    payload: JobPayload,
    held: HeldJob,
    reason: WaitReason,
  ): Promise<void> {
    const pool = this.deps.pool;
    this.deps.metrics.heldReleases.inc({ pool, reason });
    try {
      // Back in the queue on its own some time after its deadline, by when its gateway has
      // answered and removed it: only a job whose gateway died is taken (and expired) then.
      await job.moveToDelayed(payload.deadline + HELD_GRACE_MS, token);
    } catch (err) {
      // Removed by its gateway meanwhile, or the lock was lost: nothing to hold.
      this.deps.log.warn({ err, pool, jobId: job.id }, 'holding a job back failed');
      return;
    }
    this.held.add(held);
    this.setMetrics();
    this.maybePromote();
  }

  /**
   * Promotes the first held job that may go now back into the queue, one at a time, at its
   * front; the promotion wakes the release loop's blocking take.
   */
  maybePromote(): void {
    // One promotion at a time: `promoted` stays set until the loop takes that job back.
    if (this.held.size === 0 || this.held.promoted !== undefined || !this.deps.isLeader()) return;
    const now = this.deps.now();
    const next = nextToPromote(this.held.ordered(), this.deps.context(now));
    if (next) void this.promote(next);
  }

  /**
   * BullMQ's promote puts a job back behind every job of its priority queued meanwhile; this
   * one was taken once already and the release order chose it now, so it then goes to the
   * queue's front (priority 0, LIFO: the end of the wait list a take pops first). The loop or
   * a handover takes it next, and the fair share makes no pick for that take.
   */
  private async promote(h: HeldJob): Promise<void> {
    this.held.promoted = h.id;
    try {
      await h.job.promote();
      await h.job.changePriority({ priority: 0, lifo: true });
    } catch {
      // No longer delayed: its client went and the gateway removed it, or BullMQ moved it
      // back at its deadline (the loop then takes and skips it).
      this.held.remove(h.id);
      this.setMetrics();
    }
    this.deps.changed();
  }

  /**
   * A new leader takes over the jobs its predecessor held back. Each is read on its own (not
   * `getDelayed`, which fails whole for one job whose data is not JSON): one that cannot be
   * read is left where it is, one whose payload is invalid is discarded, the others adopted.
   */
  async adopt(): Promise<void> {
    const { queue, pool, log } = this.deps;
    let ids: string[];
    try {
      ids = await queue.getRanges(['delayed'], 0, -1, true);
    } catch (err) {
      log.warn({ err, pool }, 'reading held jobs failed');
      return;
    }
    const jobs = await Promise.all(ids.map((id) => this.readHeld(id)));
    for (const job of jobs) {
      if (!job?.id) continue;
      let payload: JobPayload;
      try {
        payload = validateJobPayload(job.data);
      } catch (err) {
        await this.discard(job.id, (err as Error).message);
        continue;
      }
      const tokens = payload.promptTokens ?? 0;
      this.held.add({
        id: job.id,
        job,
        promptTokens: tokens,
        long: classify(tokens, this.deps.longPrompts) === 'long',
        priority: payload.priority,
        enqueuedAt: payload.enqueuedAt,
        sequences: payload.sequences ?? 1,
      });
    }
    if (this.held.size > 0) log.info({ pool, held: this.held.size }, 'adopted held jobs');
    this.setMetrics();
    this.deps.changed();
  }

  /** A held job as Redis has it (buildJob: bad data does not throw); undefined if gone or unread. */
  private async readHeld(id: string): Promise<Job | undefined> {
    const { queue, pool, log } = this.deps;
    try {
      const json = await queue.getBackend().getJobData(id);
      return json && buildJob(queue, json, id);
    } catch (err) {
      // Left in the delayed set: BullMQ moves it back at its deadline, and the take checks it.
      log.warn({ err, pool, jobId: id }, 'reading a held job failed');
      return undefined;
    }
  }

  /**
   * Removes a held job that can never run, as the release loop fails one it took: it would
   * otherwise count against the queue's bound until BullMQ moved it back. No frame can be
   * addressed from a payload that does not check: its gateway finds the job gone (its parked
   * watch answers `queue_lost`), as for one the release loop fails.
   */
  private async discard(jobId: string, why: string): Promise<void> {
    const { queue, pool, log, metrics } = this.deps;
    log.warn({ pool, jobId, err: why }, 'invalid job payload');
    metrics.skipped.inc({ pool, reason: 'invalid_payload' });
    await queue.remove(jobId).catch((err: unknown) => {
      log.warn({ err, pool, jobId }, 'discarding a held job failed');
    });
  }

  /** Drops held jobs that no longer exist (removed by their gateway when the client went). */
  async prune(): Promise<void> {
    const held = this.held.ordered().slice();
    if (held.length === 0) return;
    const pipeline = this.deps.redis.pipeline();
    for (const h of held) pipeline.exists(this.deps.queue.toKey(h.id));
    const results = (await pipeline.exec()) ?? [];
    let pruned = false;
    held.forEach((h, i) => {
      const [err, exists] = results[i] ?? [];
      if (!err && exists === 0) pruned = this.held.remove(h.id) !== undefined || pruned;
    });
    if (pruned) {
      this.setMetrics();
      this.deps.changed();
    }
  }

  private setMetrics(): void {
    this.deps.metrics.longHeld.set({ pool: this.deps.pool }, this.held.longTokens().count);
  }
}
