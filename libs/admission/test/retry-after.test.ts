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
});
