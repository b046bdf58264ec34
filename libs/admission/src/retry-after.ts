// How long a refused client should wait before trying again, from how fast the pool drains.
//
// The drain rate is measured only while there is something to drain: a window in which no job
// waited says how fast requests came, not how fast the pool can serve them. Counted as
// nothing released, an idle spell decayed the rate toward 0 without reaching it (30 s idle
// left 0.0000366/s of a 4/s pool), and the first burst after it was told to come back in
// 60 s by a pool that drains it in 2 or 3.

export interface RetryAfterInput {
  /** Requests ahead of the one being refused (queued now). */
  queued: number;
  /**
   * Jobs the pool releases per second while jobs wait, smoothed (`smoothRate`); 0 or
   * unknown until a backlog has drained.
   */
  drainPerSecond: number | undefined;
}

export const retryAfterBounds = { min: 1, max: 60, unknown: 5 } as const;

/**
 * Whole seconds until the queue ahead has likely drained, clamped to [1, 60]. With no
 * observed drain it answers 5 s (what the reference PR used): long enough not to hammer,
 * short enough that a recovered pool is retried soon. A rate that is known stays what the
 * last backlog measured through an idle spell of any length (`smoothRate`).
 */
export function retryAfterSeconds({ queued, drainPerSecond }: RetryAfterInput): number {
  if (drainPerSecond === undefined || !(drainPerSecond > 0)) return retryAfterBounds.unknown;
  // A negative or unreadable queue length counts as nothing ahead.
  const ahead = queued > 0 ? queued : 0;
  const seconds = Math.ceil((ahead + 1) / drainPerSecond);
  return Math.min(retryAfterBounds.max, Math.max(retryAfterBounds.min, seconds));
}

/** One window of the pool leader's stats tick, as the drain rate reads it. */
export interface DrainWindow {
  /** Jobs released in the window. */
  released: number;
  /** Its length. */
  seconds: number;
  /**
   * Whether jobs waited in it: the queue not empty, or no engine with room, at its start or
   * its end. Only then do its releases follow the pool's pace rather than the requests'.
   */
  backlogged: boolean;
}

/**
 * The drain rate after `window`: its releases per second, blended into `previous` with weight
 * `alpha` per second of the window, so irregular windows weigh correctly. A window in which no
 * job waited leaves the rate as it was (undefined until a backlog has been seen), whatever its
 * length: the pool's pace is unknown then, not slower. A backlog that does not drain (a paused
 * pool, closed gates) still brings the rate down.
 */
export function smoothRate(
  previous: number | undefined,
  { released, seconds, backlogged }: DrainWindow,
  alpha = 0.3,
): number | undefined {
  if (!backlogged || !(seconds > 0)) return previous;
  const sample = released / seconds;
  if (previous === undefined) return sample;
  const weight = 1 - Math.pow(1 - alpha, seconds);
  return previous + weight * (sample - previous);
}
