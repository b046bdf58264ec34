import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import {
  retryAfterBounds,
  retryAfterSeconds,
  smoothRate,
  type DrainWindow,
} from '../src/retry-after.ts';

describe('Retry-After estimate', () => {
  it('is the time to drain the queue ahead, in whole seconds', () => {
    expect(retryAfterSeconds({ queued: 7, drainPerSecond: 2 })).toBe(4);
    expect(retryAfterSeconds({ queued: 0, drainPerSecond: 10 })).toBe(1);
  });

  it('answers 5 s while the drain rate is unknown', () => {
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
    const busy = (released: number, seconds: number) => ({ released, seconds, backlogged: true });
    expect(smoothRate(undefined, busy(10, 1))).toBe(10);
    const next = smoothRate(10, busy(0, 1), 0.3);
    expect(next).toBeCloseTo(7, 10);
    expect(smoothRate(10, busy(0, 0))).toBe(10);
    // A long gap weighs the new sample more than a short one.
    expect(smoothRate(10, busy(0, 5), 0.3)).toBeLessThan(smoothRate(10, busy(0, 1), 0.3)!);
  });

  it('counts only windows in which jobs waited: an idle spell leaves the rate, and Retry-After, as the last backlog left them', () => {
    // A pool that drained 4 jobs a second while jobs waited, then 30 s with nothing to drain.
    let rate: number | undefined;
    for (let s = 0; s < 5; s += 1)
      rate = smoothRate(rate, { released: 4, seconds: 1, backlogged: true });
    expect(rate).toBe(4);
    for (let s = 0; s < 30; s += 1)
      rate = smoothRate(rate, { released: 0, seconds: 1, backlogged: false });
    expect(rate).toBe(4);
    // A burst then fills the queue (8): the refused client is told 3 s, not 60.
    expect(retryAfterSeconds({ queued: 8, drainPerSecond: rate })).toBe(3);
    // A stats tick late by a minute: one idle window of 60 s changes nothing either.
    expect(smoothRate(4, { released: 0, seconds: 60, backlogged: false })).toBe(4);
    // Releases while nothing waited followed the requests, not the pool: not counted.
    expect(smoothRate(4, { released: 1, seconds: 1, backlogged: false })).toBe(4);
  });

  it('is unknown (5 s) until a backlog has been seen, however long the pool idled', () => {
    expect(smoothRate(undefined, { released: 0, seconds: 3600, backlogged: false })).toBe(
      undefined,
    );
    expect(smoothRate(undefined, { released: 2, seconds: 1, backlogged: false })).toBe(undefined);
    expect(retryAfterSeconds({ queued: 8, drainPerSecond: undefined })).toBe(5);
  });

  it('still comes down while a backlog does not drain (a paused pool, closed gates)', () => {
    let rate: number | undefined = 4;
    for (let s = 0; s < 30; s += 1)
      rate = smoothRate(rate, { released: 0, seconds: 1, backlogged: true });
    expect(retryAfterSeconds({ queued: 8, drainPerSecond: rate })).toBe(60);
  });

  it('an idle spell of any length never raises Retry-After above what the last backlog gives, nor changes what a later backlog measures', () => {
    const window = (backlogged: boolean, minReleased = 0) =>
      fc.record({
        released: fc.integer({ min: minReleased, max: 200 }),
        seconds: fc.double({ min: 0.01, max: 3600, noNaN: true }),
        backlogged: fc.constant(backlogged),
      });
    fc.assert(
      fc.property(
        fc.array(window(true), { minLength: 1, maxLength: 20 }),
        fc.array(window(false), { maxLength: 50 }),
        window(true, 1),
        fc.nat(10_000),
        (busy, idle, after, queued) => {
          const run = (windows: readonly DrainWindow[]) =>
            windows.reduce<number | undefined>((rate, w) => smoothRate(rate, w), undefined);
          const lastBusy = run(busy);
          const afterIdle = run([...busy, ...idle]);
          expect(afterIdle).toBe(lastBusy);
          expect(retryAfterSeconds({ queued, drainPerSecond: afterIdle })).toBeLessThanOrEqual(
            retryAfterSeconds({ queued, drainPerSecond: lastBusy }),
          );
          // A backlog after the spell is measured as if the spell had not been.
          const later = run([...busy, ...idle, after]);
          expect(later).toBe(run([...busy, after]));
          expect(later).toBeGreaterThan(0);
        },
      ),
    );
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
          const next = smoothRate(
            previous,
            { released: events, seconds, backlogged: true },
            alpha,
          )!;
          const eps = 1e-9 * Math.max(1, previous, sample);
          expect(next).toBeGreaterThanOrEqual(Math.min(previous, sample) - eps);
          expect(next).toBeLessThanOrEqual(Math.max(previous, sample) + eps);
        },
      ),
    );
  });
});
