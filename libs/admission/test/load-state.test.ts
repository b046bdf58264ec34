// The load-state machine: EMA + thresholds with hysteresis. Examples first, then properties
// over arbitrary reading sequences and profile sets, then the flapping comparison of issue 5.
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import {
  initialLoadState,
  loadSignal,
  nextLoadState,
  type LoadProfile,
  type LoadState,
  type LoadStateOptions,
} from '../src/load-state.ts';

/** The article's profiles, as the config ships them. */
const PROFILES: LoadProfile[] = [
  { name: 'normal', threshold: 0, maxTokensFactor: 1 },
  { name: 'tired', threshold: 0.75, instruction: 'Answer concisely.', maxTokensFactor: 0.7 },
  {
    name: 'lazy',
    threshold: 0.9,
    instruction: 'Provide extremely short answers only.',
    maxTokensFactor: 0.3,
  },
];
const options = (alpha = 0.3, hysteresis = 0.05): LoadStateOptions => ({
  profiles: PROFILES,
  alpha,
  hysteresis,
});

/** Feeds readings in order; returns every state after the initial one. */
function run(readings: readonly (number | undefined)[], opts: LoadStateOptions): LoadState[] {
  const states: LoadState[] = [];
  let state = initialLoadState();
  for (const reading of readings) {
    state = nextLoadState(state, reading, opts);
    states.push(state);
  }
  return states;
}

/** Oracle: the highest profile whose threshold the value reaches. */
const highest = (profiles: readonly LoadProfile[], value: number) =>
  profiles.reduce((best, p, i) => (i > 0 && value >= p.threshold ? i : best), 0);

describe('nextLoadState: examples', () => {
  it('starts in the first profile with nothing smoothed', () => {
    expect(initialLoadState()).toEqual({ smoothed: undefined, index: 0, changes: 0 });
  });

  it('initialises the EMA with the first reading, then blends with alpha', () => {
    const [first, second, third] = run([0.8, 0.5, 0.5], options());
    expect(first).toEqual({ smoothed: 0.8, index: 1, changes: 1 });
    expect(second?.smoothed).toBeCloseTo(0.3 * 0.5 + 0.7 * 0.8, 12); // 0.71
    // 0.71 is below 0.75 but not below 0.75 - 0.05: still tired.
    expect(second?.index).toBe(1);
    expect(third?.smoothed).toBeCloseTo(0.3 * 0.5 + 0.7 * 0.71, 12); // 0.647
    expect(third).toMatchObject({ index: 0, changes: 2 });
  });

  it('may jump several states at once, up and down, counting one change each time', () => {
    const states = run([0, 0.95, 0.1], options(1, 0.05));
    expect(states.map((s) => s.index)).toEqual([0, 2, 0]);
    expect(states.at(-1)?.changes).toBe(2);
  });

  it('enters a state at exactly its threshold and leaves only below threshold - hysteresis', () => {
    const opts = options(1, 0.05);
    expect(run([0.75], opts)[0]?.index).toBe(1);
    expect(run([0.7499], opts)[0]?.index).toBe(0);
    expect(run([0.75, 0.7], opts).map((s) => s.index)).toEqual([1, 1]); // 0.70 is not < 0.70
    expect(run([0.75, 0.6999], opts).map((s) => s.index)).toEqual([1, 0]);
    // From lazy, 0.86 stays lazy; 0.84 drops to tired (not below 0.70), 0.69 to normal.
    expect(run([0.9, 0.86, 0.84, 0.69], opts).map((s) => s.index)).toEqual([2, 2, 1, 0]);
  });

  it('treats a missing or unreadable reading as no reading: the state object is returned as is', () => {
    const state = run([0.8], options())[0] as LoadState;
    for (const reading of [undefined, Number.NaN, Infinity, -Infinity])
      expect(nextLoadState(state, reading, options())).toBe(state);
    expect(nextLoadState(initialLoadState(), Number.NaN, options()).smoothed).toBeUndefined();
  });

  it('clamps readings to 0..1', () => {
    expect(run([1.7], options())[0]?.smoothed).toBe(1);
    expect(run([-3], options())[0]?.smoothed).toBe(0);
  });

  it('copes with a state whose index no longer exists (profiles reconfigured)', () => {
    const stale: LoadState = { smoothed: 0.1, index: 7, changes: 4 };
    expect(nextLoadState(stale, 0.1, options())).toMatchObject({ index: 0, changes: 5 });
  });

  it('refuses options no configuration can produce', () => {
    const s = initialLoadState();
    expect(() => nextLoadState(s, 0.5, { ...options(), profiles: [] })).toThrow(RangeError);
    for (const alpha of [0, -0.1, 1.01, Number.NaN])
      expect(() => nextLoadState(s, 0.5, options(alpha))).toThrow(RangeError);
    for (const hysteresis of [-0.01, Number.NaN, Infinity])
      expect(() => nextLoadState(s, 0.5, options(0.3, hysteresis))).toThrow(RangeError);
  });
});

// Arbitrary profile sets: ascending thresholds, the first at 0.
const profiles: fc.Arbitrary<LoadProfile[]> = fc
  .uniqueArray(fc.double({ min: 0.01, max: 1, noNaN: true }), { maxLength: 5 })
  .map((thresholds) =>
    [0, ...thresholds.sort((a, b) => a - b)].map((threshold, i) => ({
      name: `p${i}`,
      threshold,
      maxTokensFactor: 1,
    })),
  );
const reading = fc.oneof(
  { arbitrary: fc.double({ min: 0, max: 1, noNaN: true }), weight: 8 },
  { arbitrary: fc.constantFrom(0, 0.7, 0.75, 0.8, 0.9, 1), weight: 2 },
  { arbitrary: fc.constantFrom(undefined, Number.NaN), weight: 1 },
);
// Uniform readings, and readings hovering close to one of the thresholds (where flapping
// would happen), paired with their profile set.
const hovering = (ps: LoadProfile[]) =>
  fc
    .tuple(
      fc.constantFrom(...ps.map((p) => p.threshold)),
      fc.double({ min: 0.01, max: 0.2, noNaN: true }),
      fc.array(fc.double({ min: -1, max: 1, noNaN: true }), { maxLength: 200 }),
    )
    .map(([center, spread, offsets]) =>
      offsets.map((d) => Math.min(1, Math.max(0, center + spread * d))),
    );
const scenario: fc.Arbitrary<[LoadProfile[], (number | undefined)[]]> = profiles.chain((ps) =>
  fc.tuple(fc.constant(ps), fc.oneof(fc.array(reading, { maxLength: 200 }), hovering(ps))),
);
const alpha = fc.oneof(fc.double({ min: 0.01, max: 1, noNaN: true }), fc.constant(0.3));
const hysteresis = fc.oneof(fc.double({ min: 0.001, max: 0.3, noNaN: true }), fc.constant(0.05));
const EPS = 1e-12;

describe('nextLoadState: properties', () => {
  it('keeps the EMA within [min, max] of the readings seen so far', () => {
    fc.assert(
      fc.property(scenario, alpha, hysteresis, ([ps, rs], a, h) => {
        let state = initialLoadState();
        let low = Infinity;
        let high = -Infinity;
        for (const r of rs) {
          state = nextLoadState(state, r, { profiles: ps, alpha: a, hysteresis: h });
          if (r === undefined || Number.isNaN(r)) continue;
          low = Math.min(low, r);
          high = Math.max(high, r);
          expect(state.smoothed).toBeGreaterThanOrEqual(low);
          expect(state.smoothed).toBeLessThanOrEqual(high);
        }
      }),
    );
  });

  it('after a move up, is the highest profile whose threshold <= smoothed; otherwise at most the hysteresis band above it', () => {
    fc.assert(
      fc.property(scenario, alpha, hysteresis, ([ps, rs], a, h) => {
        let state = initialLoadState();
        for (const r of rs) {
          const before = state;
          state = nextLoadState(state, r, { profiles: ps, alpha: a, hysteresis: h });
          if (state.smoothed === undefined) continue;
          const reached = highest(ps, state.smoothed);
          if (state.index > before.index) expect(state.index).toBe(reached);
          expect(state.index).toBeGreaterThanOrEqual(reached);
          // Above the reached profile only while inside the current state's band.
          if (state.index > reached)
            expect(state.smoothed).toBeGreaterThanOrEqual(
              (ps[state.index] as LoadProfile).threshold - h,
            );
          expect(state.changes).toBe(before.changes + (state.index === before.index ? 0 : 1));
        }
      }),
    );
  });

  it('never flaps: a change against the direction of the previous one needs the smoothed value to have moved by at least the hysteresis', () => {
    fc.assert(
      fc.property(scenario, alpha, hysteresis, ([ps, rs], a, h) => {
        let state = initialLoadState();
        let last: { direction: number; smoothed: number } | undefined;
        for (const r of rs) {
          const before = state;
          state = nextLoadState(state, r, { profiles: ps, alpha: a, hysteresis: h });
          if (state.index === before.index) continue;
          const direction = Math.sign(state.index - before.index);
          const smoothed = state.smoothed as number;
          if (last && direction !== last.direction)
            expect(Math.abs(smoothed - last.smoothed)).toBeGreaterThanOrEqual(h - EPS);
          last = { direction, smoothed };
        }
      }),
    );
  });

  it('so a -> b -> a needs a swing of at least the hysteresis', () => {
    fc.assert(
      fc.property(scenario, alpha, hysteresis, ([ps, rs], a, h) => {
        const states = run(rs, { profiles: ps, alpha: a, hysteresis: h });
        // The smoothed values at which each change happened, in order.
        const changes: { index: number; smoothed: number }[] = [];
        let index = 0;
        for (const s of states)
          if (s.index !== index) {
            changes.push({ index: s.index, smoothed: s.smoothed as number });
            index = s.index;
          }
        for (let i = 1; i < changes.length; i += 1) {
          const from = i >= 2 ? (changes[i - 2] as { index: number }).index : 0;
          const back = changes[i] as { index: number; smoothed: number };
          if (back.index !== from) continue;
          // The swing between entering b and returning to a.
          const entered = (changes[i - 1] as { smoothed: number }).smoothed;
          expect(Math.abs(back.smoothed - entered)).toBeGreaterThanOrEqual(h - EPS);
        }
      }),
    );
  });

  it('with hysteresis 0, is exactly the highest profile whose threshold <= smoothed', () => {
    fc.assert(
      fc.property(scenario, alpha, ([ps, rs], a) => {
        for (const s of run(rs, { profiles: ps, alpha: a, hysteresis: 0 }))
          expect(s.index).toBe(s.smoothed === undefined ? 0 : highest(ps, s.smoothed));
      }),
    );
  });

  it('with alpha 1, smoothed is the last reading', () => {
    fc.assert(
      fc.property(scenario, hysteresis, ([ps, rs], h) => {
        let lastReading: number | undefined;
        for (const [i, s] of run(rs, { profiles: ps, alpha: 1, hysteresis: h }).entries()) {
          const r = rs[i];
          if (r !== undefined && !Number.isNaN(r)) lastReading = r;
          expect(s.smoothed).toBe(lastReading);
        }
      }),
    );
  });

  it('does not change state in the middle of a band, whatever the hysteresis', () => {
    fc.assert(
      fc.property(
        alpha,
        hysteresis,
        fc.array(fc.double({ min: 0.2, max: 0.55, noNaN: true }), { maxLength: 100 }),
        (a, h, rs) => {
          // Readings well inside normal: never leaves it.
          expect(
            run(rs, { profiles: PROFILES, alpha: a, hysteresis: h }).every((s) => s.index === 0),
          ).toBe(true);
        },
      ),
    );
  });
});

/** A deterministic pseudo-random sequence (mulberry32), so the counts below are stable. */
function mulberry32(seed: number): () => number {
  let a = seed;
  return () => {
    a = (a + 0x6d2b79f5) | 0;
    let t = Math.imul(a ^ (a >>> 15), 1 | a);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

describe('a signal oscillating around the tired threshold (0.75)', () => {
  // 1000 readings: a sinusoid of amplitude 0.03 (period 40 readings) plus uniform noise of
  // ±0.06 around 0.75. Both runs use the article's EMA (alpha 0.3); the smoothed value then
  // moves within about 0.69..0.81, crossing 0.75 again and again.
  const random = mulberry32(20240501);
  const signal = Array.from(
    { length: 1000 },
    (_, t) => 0.75 + 0.03 * Math.sin((2 * Math.PI * t) / 40) + 0.06 * (2 * random() - 1),
  );
  const changes = (h: number) => run(signal, options(0.3, h)).at(-1)?.changes;

  it('changes state 136 times without hysteresis and 15 times with 0.05', () => {
    const without = changes(0);
    const withMargin = changes(0.05);
    expect(without).toBe(136);
    expect(withMargin).toBe(15);
    expect((withMargin as number) * 5).toBeLessThan(without as number);
  });

  it('changes state less the wider the margin', () => {
    const counts = [0, 0.01, 0.02, 0.05, 0.1].map(changes) as number[];
    for (let i = 1; i < counts.length; i += 1)
      expect(counts[i]).toBeLessThanOrEqual(counts[i - 1] as number);
    expect(counts.at(-1)).toBeLessThanOrEqual(1); // 0.10 below 0.75 is never reached after entering
  });
});

describe('loadSignal', () => {
  it('is the maximum of the selected inputs that are available', () => {
    const inputs = { kvUsage: 0.4, gpuUtilization: 0.8, queuePressure: 0.6 };
    expect(loadSignal(inputs, ['kv'])).toBe(0.4);
    expect(loadSignal(inputs, ['kv', 'gpu'])).toBe(0.8);
    expect(loadSignal(inputs, ['kv', 'queue'])).toBe(0.6);
    expect(loadSignal(inputs, ['queue', 'gpu', 'kv'])).toBe(0.8);
  });

  it('skips missing and unreadable inputs; undefined when none is left', () => {
    expect(loadSignal({ kvUsage: 0.3 }, ['kv', 'gpu'])).toBe(0.3);
    expect(loadSignal({ kvUsage: Number.NaN, gpuUtilization: 0.2 }, ['kv', 'gpu'])).toBe(0.2);
    expect(loadSignal({ gpuUtilization: 0.9 }, ['kv'])).toBeUndefined();
    expect(loadSignal({ kvUsage: 0.5 }, [])).toBeUndefined();
    expect(loadSignal({}, ['kv', 'gpu', 'queue'])).toBeUndefined();
  });

  it('clamps each input to 0..1', () => {
    expect(loadSignal({ queuePressure: 3 }, ['queue'])).toBe(1);
    expect(loadSignal({ kvUsage: -0.5 }, ['kv'])).toBe(0);
  });

  it('always lies in 0..1 and is at least every selected available input (clamped)', () => {
    const input = fc.option(fc.double({ min: -2, max: 3 }), { nil: undefined });
    fc.assert(
      fc.property(
        fc.record({ kvUsage: input, gpuUtilization: input, queuePressure: input }),
        fc.subarray(['kv', 'gpu', 'queue'] as const),
        (inputs, sources) => {
          const signal = loadSignal(inputs, sources);
          const values = sources
            .map((s) =>
              s === 'kv'
                ? inputs.kvUsage
                : s === 'gpu'
                  ? inputs.gpuUtilization
                  : inputs.queuePressure,
            )
            .filter((v): v is number => v !== undefined && Number.isFinite(v))
            .map((v) => Math.min(1, Math.max(0, v)));
          expect(signal).toBe(values.length === 0 ? undefined : Math.max(...values));
        },
      ),
    );
  });
});
