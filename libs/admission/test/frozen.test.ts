// How long an engine's scrapes have read the same (frozen.ts): the input of the frozen-gauge
// rule in gate.ts.
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { sameReading, unchangedSince, type EngineReading } from '../src/frozen.ts';
import type { EngineGauges } from '../src/gate.ts';

const T = 1_700_000_000_000;

const reading = (over: Partial<EngineReading> = {}): EngineReading => ({
  running: 4,
  waiting: 0,
  kvUsage: 0.5,
  steps: 812,
  at: T,
  ...over,
});

const taken = (r: EngineReading, since?: number): EngineGauges => ({
  ...r,
  inflightAtScrape: 0,
  ...(since === undefined ? {} : { unchangedSince: since }),
});

describe('sameReading', () => {
  it('compares running, waiting, KV usage and the step counter, not the time', () => {
    expect(sameReading(reading(), reading({ at: T + 60_000 }))).toBe(true);
    for (const over of [{ running: 3 }, { waiting: 1 }, { kvUsage: 0.5001 }, { steps: 813 }])
      expect(sameReading(reading(), reading(over))).toBe(false);
  });

  it('a counter absent from both is equal; present in one only, different', () => {
    expect(sameReading(reading({ steps: undefined }), reading({ steps: undefined }))).toBe(true);
    expect(sameReading(reading({ steps: undefined }), reading())).toBe(false);
    expect(sameReading(reading(), reading({ steps: undefined }))).toBe(false);
  });

  it('a number that is not finite never reads as unchanged', () => {
    for (const over of [
      { running: Number.NaN },
      { kvUsage: Number.NaN },
      { steps: Number.NaN },
      { steps: Number.POSITIVE_INFINITY },
    ])
      expect(sameReading(reading(over), reading(over))).toBe(false);
  });
});

describe('unchangedSince', () => {
  it('starts a run at the first scrape, keeps it while the scrapes read the same, and starts again at a change', () => {
    const first = taken(reading(), unchangedSince(undefined, reading()));
    expect(first.unchangedSince).toBe(T);
    const second = taken(reading({ at: T + 500 }), unchangedSince(first, reading({ at: T + 500 })));
    expect(second.unchangedSince).toBe(T);
    expect(unchangedSince(second, reading({ at: T + 1000 }))).toBe(T);
    expect(unchangedSince(second, reading({ at: T + 1000, steps: 813 }))).toBe(T + 1000);
  });

  it('a previous scrape that carries no run starts one at its own time', () => {
    expect(unchangedSince(taken(reading()), reading({ at: T + 700 }))).toBe(T);
  });

  it('scrapes out of order start a new run', () => {
    expect(unchangedSince(taken(reading({ at: T + 10 }), T), reading({ at: T }))).toBe(T);
    expect(unchangedSince(taken(reading(), T - 5000), reading({ at: Number.NaN }))).toBeNaN();
  });

  it('over any sequence: never after the scrape, and the run is exactly the identical scrapes before it', () => {
    const step = fc.record({
      dt: fc.nat(2_000),
      running: fc.nat(2),
      steps: fc.option(fc.nat(2), { nil: undefined }),
    });
    fc.assert(
      fc.property(fc.array(step, { minLength: 1, maxLength: 60 }), (steps) => {
        let at = T;
        let previous: EngineGauges | undefined;
        const seen: EngineReading[] = [];
        for (const s of steps) {
          at += s.dt;
          const next = reading({ at, running: s.running, steps: s.steps });
          const since = unchangedSince(previous, next);
          seen.push(next);
          // Oracle: walk back over the scrapes that read the same as this one.
          let i = seen.length - 1;
          while (i > 0 && sameReading(seen[i - 1]!, next)) i -= 1;
          expect(since).toBe(seen[i]!.at);
          expect(since).toBeLessThanOrEqual(at);
          previous = taken(next, since);
        }
      }),
    );
  });
});
