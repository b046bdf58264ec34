// Parked jobs that Redis no longer has. A Redis restarted without persistence (or failed
// over to a replica that had not caught up) forgets the queue, and nothing else would tell
// the clients whose jobs were in it: they would wait for the park limit and then hear
// "no capacity". This watch reads, every interval and right after Redis is back, whether
// each parked job of this replica still exists.
//
// Only jobs that are queued (a running one has had its `start` frame, and a finished one is
// removed on purpose) and whose add has resolved are read. A job seen missing is reported
// only when it is still parked and missing at the next read: a dispatcher that has just taken
// and ended a job publishes its frames before removing it, but they travel on another
// connection and may be read after our EXISTS answer. For the same reason nothing is read
// while the reply connection is down, and what was suspected before it went down is
// forgotten: a job served meanwhile is gone too, with its frames.
//
// The same round reads whether each pool with parked jobs still has a leader: a pool that
// loses its last dispatcher keeps its queue, and nothing would release it, so its clients
// would wait their park limit and then hear "no capacity" while new requests are refused
// no_leader at once. The reading is PoolQueue.hasLeader's, cached and forgiving a hand-over:
// a pool answers "none" only once its lease has been missing past HANDOVER_GRACE_MS, as it
// does for new requests. Its parked jobs are then removed, and only a client whose job was
// removed is answered (no_leader): the removal is BullMQ's removeJob script, as for a client
// that left, which leaves a job under a dispatcher's lock alone, and a take is one script
// too, so a leader that appears and takes a job at that moment runs it for its client.
import type { Redis } from '@sluice/redis';
import type { HeldRequest } from './held-request.js';
import type { PoolQueue } from './pool-queue.js';

/** What the watch reads and removes in a pool's queue. */
export type ParkedPool = Pick<PoolQueue, 'pool' | 'hasLeader' | 'retryAfter' | 'withdrawQueued'>;

export interface LeaderWatch {
  /** The pool whose queue holds the job of `held`; none: its leader is not read. */
  poolOf(held: HeldRequest): ParkedPool | undefined;
  /**
   * The job of `held`, still parked, was removed from the queue of `pool`, which has no
   * leader; `retryAfter` is the pool's, read before the removal, so that nothing comes between
   * the removal and the answer.
   */
  onLeaderless(held: HeldRequest, pool: ParkedPool, retryAfter: number | undefined): void;
}

export interface ParkedWatchOptions {
  intervalMs: number;
  /** Frames can reach this replica (the reply connection is up). */
  listening(): boolean;
  /**
   * The job of `held` is not in Redis: two reads in a row, the second at least
   * SECOND_READ_AFTER of an interval after the first.
   */
  onLost(held: HeldRequest): void;
  /** Read each parked job's pool for a leader (absent: only existence is read). */
  leaders?: LeaderWatch;
  onError(err: unknown): void;
  now?: () => number;
}

/** The share of an interval after which a second read that finds a job missing is believed. */
export const SECOND_READ_AFTER = 0.75;

export class ParkedWatch {
  private timer: NodeJS.Timeout | undefined;
  private running = false;
  /** Jobs seen missing, with when they were first seen missing. */
  private suspects = new Map<HeldRequest, number>();

  constructor(
    private readonly redis: Redis,
    private readonly held: () => Iterable<HeldRequest>,
    private readonly options: ParkedWatchOptions,
  ) {}

  start(): void {
    this.timer = setInterval(() => void this.check(), this.options.intervalMs);
    this.timer.unref();
  }

  stop(): void {
    clearInterval(this.timer);
  }

  /**
   * One round of reads: EXISTS per parked job, then each of their pools' leader, auto-pipelined,
   * each bounded by the command timeout.
   */
  async check(): Promise<void> {
    if (!this.options.listening()) this.suspects.clear();
    if (this.running || this.redis.status !== 'ready' || !this.options.listening()) return;
    this.running = true;
    try {
      const parked = [...this.held()].filter((h) => h.parked);
      const answers = await Promise.allSettled(parked.map((h) => this.redis.exists(h.jobKey)));
      const suspects = new Map<HeldRequest, number>();
      const now = (this.options.now ?? Date.now)();
      let failure: unknown;
      answers.forEach((answer, i) => {
        const held = parked[i]!;
        // Unknown is not missing: a job whose read failed is read again next round.
        if (answer.status === 'rejected') failure ??= answer.reason;
        else if (answer.value === 0 && held.parked) {
          // Reads triggered back to back (a reconnect, then the timer) are one read: the
          // frames of a job served meanwhile get about an interval to arrive. About: the timer's
          // rounds are an interval apart, but each `now` is read when its answers are in, so
          // two rounds in a row measured a little under an interval would wait for a third.
          const since = this.suspects.get(held) ?? now;
          if (now - since >= this.options.intervalMs * SECOND_READ_AFTER) this.options.onLost(held);
          else suspects.set(held, since);
        }
      });
      this.suspects = suspects;
      const leaderFailure = await this.leaderless(parked);
      failure ??= leaderFailure;
      if (failure !== undefined) this.options.onError(failure);
    } finally {
      this.running = false;
    }
  }

  /** Takes back the parked jobs of pools without a leader; answers the first failure, if any. */
  private async leaderless(parked: HeldRequest[]): Promise<unknown> {
    const leaders = this.options.leaders;
    if (!leaders) return undefined;
    const byPool = new Map<ParkedPool, HeldRequest[]>();
    for (const held of parked) {
      const pool = held.parked ? leaders.poolOf(held) : undefined;
      if (!pool) continue;
      const jobs = byPool.get(pool);
      if (jobs) jobs.push(held);
      else byPool.set(pool, [held]);
    }
    const rounds = await Promise.allSettled(
      [...byPool].map(([pool, jobs]) => this.withdraw(leaders, pool, jobs)),
    );
    for (const round of rounds) {
      if (round.status === 'rejected') return round.reason;
      if (round.value !== undefined) return round.value;
    }
    return undefined;
  }

  /**
   * Removes the jobs of `pool` if it has no leader, and answers each one removed while still
   * parked. Any other outcome leaves its client as it is: `taken` runs, `missing` is the
   * existence read's to judge, and a removal that failed is tried again next round.
   */
  private async withdraw(
    leaders: LeaderWatch,
    pool: ParkedPool,
    jobs: HeldRequest[],
  ): Promise<unknown> {
    // A read that fails is unknown, not "none": nobody is answered on it.
    if (await pool.hasLeader()) return undefined;
    const retryAfter = await pool.retryAfter().catch(() => undefined);
    const removals = await Promise.allSettled(
      jobs.map((held) => (held.parked ? pool.withdrawQueued(held.jobId) : undefined)),
    );
    let failure: unknown;
    removals.forEach((removal, i) => {
      const held = jobs[i]!;
      if (removal.status === 'rejected') failure ??= removal.reason;
      else if (removal.value === 'removed' && held.parked)
        leaders.onLeaderless(held, pool, retryAfter);
    });
    return failure;
  }
}
