// How long a refused client should wait before trying again, from how fast the pool drains.

export interface RetryAfterInput {
  /** Requests ahead of the one being refused (queued now). */
  queued: number;
  /** Jobs the pool releases per second, smoothed; 0 or unknown when nothing drained lately. */
  drainPerSecond: number | undefined;
}

export const retryAfterBounds = { min: 1, max: 60, unknown: 5 } as const;

/**
 * Whole seconds until the queue ahead has likely drained, clamped to [1, 60]. With no
 * observed drain it answers 5 s (what the reference PR used): long enough not to hammer,
 * short enough that a recovered pool is retried soon.
 */
export function retryAfterSeconds({ queued, drainPerSecond }: RetryAfterInput): number {
  if (drainPerSecond === undefined || !(drainPerSecond > 0)) return retryAfterBounds.unknown;
  // A negative or unreadable queue length counts as nothing ahead.
  const ahead = queued > 0 ? queued : 0;
  const seconds = Math.ceil((ahead + 1) / drainPerSecond);
  return Math.min(retryAfterBounds.max, Math.max(retryAfterBounds.min, seconds));
}

/**
 * Exponentially smoothed rate: `events` seen over `seconds`, blended into `previous` with
 * weight `alpha` per second elapsed, so irregular sampling intervals weigh correctly.
 */
export function smoothRate(
  previous: number | undefined,
  events: number,
  seconds: number,
  alpha = 0.3,
): number {
  if (!(seconds > 0)) return previous ?? 0;
  const sample = events / seconds;
  if (previous === undefined) return sample;
  const weight = 1 - Math.pow(1 - alpha, seconds);
  return previous + weight * (sample - previous);
}
