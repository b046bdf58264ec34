// The take watchdog: a leader whose queue holds jobs the gate would admit, but whose release
// loop has had no answer to a take for longer than any healthy take can last, resets BullMQ's
// connections and abandons the take. Without it, a take that never returns holds the loop for
// good: the loop cannot end, so a lease lost and re-won meanwhile does not start it again, and
// the dispatcher leads while it takes nothing (every queued client gets its 503 at the park
// limit, until a restart).
//
// How a take hangs: BullMQ's connections have no command timeout (BullMQ requires
// `maxRetriesPerRequest: null`, and a blocking read cannot have one). Seen after a Redis
// Cluster failover (SIGKILL of the master of the pool's slot): the worker's BZPOPMIN went
// round ioredis's redirections and failover retries while the slot moved, and the take never
// came back, though BullMQ's own watchdog (redis-queue-backend.js `waitForJob`) should abandon
// a BZPOPMIN that outlives its block. And nothing at all bounds the `moveToActive` script on
// the shared connection: a connection whose path went silent (a half-open TCP connection, a
// peer or a middlebox gone without a reset) keeps it unanswered for good, while the command
// connection (bounded, reconnecting) keeps the lease.
//
// The decision is a pure function (time passed in) of what the dispatcher reads: the queue
// probe's count of waiting jobs (`wait` + `prioritized`: held jobs do not count), read on the
// command connection only once the rest says the loop is stalled, the gate (`pickEngine`) and
// since when the loop has had no answer. The episode state (one warning and one count per
// episode) is the small class below.
import type { Worker } from 'bullmq';

/**
 * How long a healthy take can go unanswered: BullMQ's longest block (10 s, when a delayed job
 * is due later) and its own watchdog's extra second. The pool's close waits as long.
 */
export const LONGEST_TAKE_MS = 11_000;

/**
 * The stall bound: the longest take and one lease TTL on top (5 s by default: 16 s in all),
 * far below a request's park limit (120 s by default), so the clients waiting are served.
 */
export function takeStallMs(leaseTtlMs: number): number {
  return LONGEST_TAKE_MS + leaseTtlMs;
}

export interface TakeWatchView {
  now: number;
  /**
   * Since when the loop has been taking without an answer (a take that answered, with a job or
   * none, or a handover's fetch ends it; a take that failed does not); undefined while it is
   * not taking (gate closed, not leading).
   */
  unansweredSince: number | undefined;
  /** Jobs waiting for a take (BullMQ's wait list and prioritized set) at the last reading. */
  waiting: number;
  /** Whether the gate admits on some engine now. */
  admits: boolean;
  /** Whether the loop should be taking: leads, not closing, not paused, Redis ready. */
  mayTake: boolean;
  stallMs: number;
}

/** Whether the loop would be stalled should jobs wait: all but the queue's reading. */
export function takeStallSuspected(view: Omit<TakeWatchView, 'waiting'>): boolean {
  return (
    view.mayTake &&
    view.admits &&
    view.unansweredSince !== undefined &&
    view.now - view.unansweredSince >= view.stallMs
  );
}

/** Whether the loop is stalled: it should take, could, has jobs to, and has had no answer. */
export function takeStalled(view: TakeWatchView): boolean {
  return view.waiting > 0 && takeStallSuspected(view);
}

/** What to do at a check: nothing, or recover (`first`: the episode's first recovery). */
export type TakeWatchAction = { recover: false } | { recover: true; first: boolean };

/**
 * The episodes of one pool. An episode starts at the first stalled check and ends when a take
 * answers (`answered`). Within one, a recovery is tried again only a whole bound after the
 * last, which counts as the loop's last sign of life.
 */
export class TakeWatchdog {
  private episode = false;
  private recoveredAt: number | undefined;

  /** Whether a check is due: the queue is worth reading (with the last recovery counted). */
  due(view: Omit<TakeWatchView, 'waiting'>): boolean {
    return takeStallSuspected(this.counted(view));
  }

  check(view: TakeWatchView): TakeWatchAction {
    if (!takeStalled(this.counted(view))) return { recover: false };
    const first = !this.episode;
    this.episode = true;
    this.recoveredAt = view.now;
    return { recover: true, first };
  }

  /** The view with the last recovery of the episode counted as the loop's last answer. */
  private counted<V extends Omit<TakeWatchView, 'waiting'>>(view: V): V {
    const since = view.unansweredSince;
    if (since === undefined || this.recoveredAt === undefined) return view;
    return { ...view, unansweredSince: Math.max(since, this.recoveredAt) };
  }

  /** A take or a handover answered: the episode, if any, is over. */
  answered(): void {
    this.episode = false;
    this.recoveredAt = undefined;
  }

  get inEpisode(): boolean {
    return this.episode;
  }
}

/**
 * Interrupts the worker's blocking wait and brings its connection back, with BullMQ's own
 * calls for it (`disconnectBlocking`, `reconnectBlocking`): that connection carries nothing but
 * the BZPOPMIN of the queue's marker, a wake-up hint, so a wait it drops loses nothing (the
 * take ends as one that found no job, or fails and is tried again).
 */
export async function resetBlocking(worker: Worker): Promise<void> {
  await worker.backend.disconnectBlocking(false);
  await worker.backend.reconnectBlocking();
}
