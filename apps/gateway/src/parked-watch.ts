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
import type { Redis } from '@sluice/redis';
import type { HeldRequest } from './held-request.js';

export interface ParkedWatchOptions {
  intervalMs: number;
  /** Frames can reach this replica (the reply connection is up). */
  listening(): boolean;
  /** The job of `held` is not in Redis (two reads in a row, at least an interval apart). */
  onLost(held: HeldRequest): void;
  onError(err: unknown): void;
  now?: () => number;
}

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

  /** One round of reads: EXISTS per parked job, auto-pipelined, each bounded by the command timeout. */
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
          // frames of a job served meanwhile get a whole interval to arrive.
          const since = this.suspects.get(held) ?? now;
          if (now - since >= this.options.intervalMs) this.options.onLost(held);
          else suspects.set(held, since);
        }
      });
      this.suspects = suspects;
      if (failure !== undefined) this.options.onError(failure);
    } finally {
      this.running = false;
    }
  }
}
