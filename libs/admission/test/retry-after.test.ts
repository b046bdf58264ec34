import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { retryAfterBounds, retryAfterSeconds, smoothRate } from '../src/retry-after.ts';

describe('Retry-After estimate', () => {
  it('is the time to drain the queue ahead, in whole seconds', () => {
    expect(retryAfterSeconds({ queued: 7, drainPerSecond: 2 })).toBe(4);
    expect(retryAfterSeconds({ queued: 0, drainPerSecond: 10 })).toBe(1);
  });

  it('answers 5 s when nothing has drained lately', () => {
    expect(retryAfterSeconds({ queued: 3, drainPerSecond: 0 })).toBe(5);
    expect(retryAfterSeconds({ queued: 3, drainPerSecond: undefined })).toBe(5);
  });

  it('stays within [1, 60] for any input', () => {
    fc.assert(
      fc.property(
        fc.nat(1_000_000),
        fc.option(fc.double({ min: 0, max: 1e6, noNaN: true })),
        (queued, rate) => {
          const s = retryAfterSeconds({ queued, drainPerSecond: rate ?? undefined });
          expect(Number.isInteger(s)).toBe(true);
          expect(s).toBeGreaterThanOrEqual(retryAfterBounds.min);
          expect(s).toBeLessThanOrEqual(retryAfterBounds.max);
        },
      ),
    );
  });

  it('smooths a rate toward new samples without jumping to them', () => {
    expect(smoothRate(undefined, 10, 1)).toBe(10);
    const next = smoothRate(10, 0, 1, 0.3);
    expect(next).toBeCloseTo(7, 10);
    expect(smoothRate(10, 0, 0)).toBe(10);
    // A long gap weighs the new sample more than a short one.
    expect(smoothRate(10, 0, 5, 0.3)).toBeLessThan(smoothRate(10, 0, 1, 0.3));
  });

  it('waits longer for a longer queue and shorter for a faster drain', () => {
    fc.assert(
      fc.property(
        fc.nat(10_000),
        fc.nat(10_000),
        fc.double({ min: 0.001, max: 1e4, noNaN: true }),
        fc.double({ min: 0.001, max: 1e4, noNaN: true }),
        (q1, q2, r1, r2) => {
          const [qa, qb] = q1 <= q2 ? [q1, q2] : [q2, q1];
          const [slow, fast] = r1 <= r2 ? [r1, r2] : [r2, r1];
          expect(retryAfterSeconds({ queued: qa, drainPerSecond: slow })).toBeLessThanOrEqual(
            retryAfterSeconds({ queued: qb, drainPerSecond: slow }),
          );
          expect(retryAfterSeconds({ queued: qa, drainPerSecond: fast })).toBeLessThanOrEqual(
            retryAfterSeconds({ queued: qa, drainPerSecond: slow }),
          );
        },
      ),
    );
  });

  it('clamps at both ends and survives unreadable inputs', () => {
    expect(retryAfterSeconds({ queued: 10_000, drainPerSecond: 0.5 })).toBe(60);
    expect(retryAfterSeconds({ queued: 0, drainPerSecond: 1e9 })).toBe(1);
    expect(retryAfterSeconds({ queued: 3, drainPerSecond: Number.POSITIVE_INFINITY })).toBe(1);
    expect(retryAfterSeconds({ queued: 3, drainPerSecond: Number.NaN })).toBe(5);
    expect(retryAfterSeconds({ queued: 3, drainPerSecond: -2 })).toBe(5);
    expect(retryAfterSeconds({ queued: Number.NaN, drainPerSecond: 2 })).toBe(1);
    expect(retryAfterSeconds({ queued: -4, drainPerSecond: 2 })).toBe(1);
    expect(retryAfterSeconds({ queued: Number.POSITIVE_INFINITY, drainPerSecond: 2 })).toBe(60);
  });

  it('a smoothed rate always lies between the previous rate and the new sample', () => {
    fc.assert(
      fc.property(
        fc.double({ min: 0, max: 1e4, noNaN: true }),
        fc.nat(10_000),
        fc.double({ min: 0.001, max: 3600, noNaN: true }),
        fc.double({ min: 0.01, max: 0.99, noNaN: true }),
        (previous, events, seconds, alpha) => {
          const sample = events / seconds;
          const next = smoothRate(previous, events, seconds, alpha);
          const eps = 1e-9 * Math.max(1, previous, sample);
          expect(next).toBeGreaterThanOrEqual(Math.min(previous, sample) - eps);
          expect(next).toBeLessThanOrEqual(Math.max(previous, sample) + eps);
        },
      ),
    );
  });
});
