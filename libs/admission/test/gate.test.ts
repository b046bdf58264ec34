import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import {
  bypassTraffic,
  freshGauges,
  gateDecision,
  gaugesFrozen,
  headroom,
  pickEngine,
  type EngineGauges,
  type EngineView,
  type GatePolicy,
} from '../src/gate.ts';

const NOW = 1_700_000_000_000;
const closed: GatePolicy = { kvThreshold: 0.9, failMode: 'closed', maxGaugeAgeMs: 5_000 };
const openMode: GatePolicy = { ...closed, failMode: 'open' };

function gauges(over: Partial<EngineGauges> = {}): EngineGauges {
  return { running: 0, waiting: 0, kvUsage: 0.1, at: NOW, inflightAtScrape: 0, ...over };
}

function engine(over: Partial<EngineView> = {}): EngineView {
  return { name: 'e', inflight: 0, cap: 4, gauges: gauges(), health: 'healthy', ...over };
}

describe('bypass estimate', () => {
  it("subtracts the broker's own in-flight at scrape time from running + waiting", () => {
    // The engine reports running 3 waiting 1 while the broker had 2 in flight: 2 bypassed.
    expect(bypassTraffic(gauges({ running: 3, waiting: 1, inflightAtScrape: 2 }))).toBe(2);
    expect(bypassTraffic(gauges({ running: 2, waiting: 0, inflightAtScrape: 2 }))).toBe(0);
  });

  it('is floored at 0 when the engine had not yet seen all of the broker requests', () => {
    expect(bypassTraffic(gauges({ running: 1, waiting: 0, inflightAtScrape: 3 }))).toBe(0);
  });

  it('is never negative and never more than running + waiting', () => {
    fc.assert(
      fc.property(fc.nat(1000), fc.nat(1000), fc.nat(1000), (running, waiting, atScrape) => {
        const b = bypassTraffic(gauges({ running, waiting, inflightAtScrape: atScrape }));
        expect(b).toBeGreaterThanOrEqual(0);
        expect(b).toBeLessThanOrEqual(running + waiting);
        expect(b).toBe(Math.max(0, running + waiting - atScrape));
      }),
    );
  });

  it('does not count the broker twice: current in-flight plus bypass', () => {
    // At scrape: broker 2 in flight, engine running 3 waiting 1, so 2 bypassed. Since then
    // the broker completed one and released none: 1 + 2 = 3 < 4, admit.
    const e = engine({
      inflight: 1,
      cap: 4,
      gauges: gauges({ running: 3, waiting: 1, inflightAtScrape: 2 }),
    });
    expect(gateDecision(e, closed, NOW)).toEqual({ admit: true });
    expect(headroom(e, closed, NOW)).toBe(1);
    // The broker released one more since the scrape: 3 + 2 = 5, no slot left.
    expect(gateDecision({ ...e, inflight: 2 }, closed, NOW)).toEqual({
      admit: false,
      reason: 'engine_busy',
    });
  });
});

describe('gate reasons', () => {
  it('without a policy only the in-flight cap applies, as before', () => {
    fc.assert(
      fc.property(fc.nat(1000), fc.integer({ min: 1, max: 1000 }), (inflight, cap) => {
        const decision = gateDecision({ name: 'e', inflight, cap });
        expect(decision.admit).toBe(inflight < cap);
        if (!decision.admit) expect(decision.reason).toBe('inflight_cap');
      }),
    );
    // Gauges are ignored without a policy, however alarming.
    const busy = engine({ gauges: gauges({ running: 50, kvUsage: 1 }), health: 'stale' });
    expect(gateDecision(busy)).toEqual({ admit: true });
    expect(gateDecision(busy, undefined, NOW)).toEqual({ admit: true });
    expect(headroom(busy)).toBe(4);
  });

  it('inflight_cap: at the cap, whatever the gauges or fail mode', () => {
    for (const policy of [closed, openMode]) {
      for (const e of [
        engine({ inflight: 4 }),
        engine({ inflight: 5 }),
        engine({ inflight: 4, health: 'stale' }),
        engine({ inflight: 4, gauges: undefined, health: 'unknown' }),
        engine({ inflight: 4, gauges: gauges({ kvUsage: 0.99, running: 9 }) }),
      ]) {
        expect(gateDecision(e, policy, NOW)).toEqual({ admit: false, reason: 'inflight_cap' });
      }
    }
    expect(gateDecision(engine({ cap: 0 }), openMode, NOW)).toEqual({
      admit: false,
      reason: 'inflight_cap',
    });
  });

  it('engine_busy: in-flight plus bypass at the cap', () => {
    const e = engine({ inflight: 1, gauges: gauges({ running: 3, inflightAtScrape: 0 }) });
    expect(gateDecision(e, closed, NOW)).toEqual({ admit: false, reason: 'engine_busy' });
    expect(gateDecision({ ...e, inflight: 0 }, closed, NOW)).toEqual({ admit: true });
  });

  it('kv_pressure: fresh KV usage at or above the threshold', () => {
    expect(gateDecision(engine({ gauges: gauges({ kvUsage: 0.9 }) }), closed, NOW)).toEqual({
      admit: false,
      reason: 'kv_pressure',
    });
    expect(gateDecision(engine({ gauges: gauges({ kvUsage: 1 }) }), openMode, NOW)).toEqual({
      admit: false,
      reason: 'kv_pressure',
    });
    expect(gateDecision(engine({ gauges: gauges({ kvUsage: 0.8999 }) }), closed, NOW)).toEqual({
      admit: true,
    });
  });

  it('engine_stale: fail mode closed refuses unknown or stale state', () => {
    const unknownStates: EngineView[] = [
      engine({ gauges: undefined, health: undefined }),
      engine({ gauges: undefined, health: 'unknown' }),
      engine({ gauges: undefined, health: 'healthy' }),
      engine({ health: 'unknown' }),
      engine({ health: 'stale' }),
      // Older than maxGaugeAgeMs although the observer has not flipped yet.
      engine({ gauges: gauges({ at: NOW - 5_001 }) }),
      engine({ gauges: gauges({ at: NOW - 5_001 }), health: undefined }),
      // Unreadable numbers are no state at all.
      engine({ gauges: gauges({ kvUsage: Number.NaN }) }),
      engine({ gauges: gauges({ running: Number.POSITIVE_INFINITY }) }),
    ];
    for (const e of unknownStates) {
      expect(gateDecision(e, closed, NOW)).toEqual({ admit: false, reason: 'engine_stale' });
      expect(freshGauges(e, closed, NOW)).toBeUndefined();
    }
  });

  it('fail mode open skips the gauge conditions on unknown or stale state', () => {
    const stalePressure = engine({
      gauges: gauges({ kvUsage: 0.99, running: 10 }),
      health: 'stale',
    });
    expect(gateDecision(stalePressure, openMode, NOW)).toEqual({ admit: true });
    const old = engine({ gauges: gauges({ kvUsage: 0.99, running: 10, at: NOW - 60_000 }) });
    expect(gateDecision(old, openMode, NOW)).toEqual({ admit: true });
    expect(gateDecision(engine({ gauges: undefined }), openMode, NOW)).toEqual({ admit: true });
    // ...and headroom ignores the stale bypass estimate.
    expect(headroom(stalePressure, openMode, NOW)).toBe(4);
  });

  it('gauges exactly maxGaugeAgeMs old are still fresh; health absent counts as healthy', () => {
    const e = engine({ gauges: gauges({ at: NOW - 5_000, kvUsage: 0.95 }), health: undefined });
    expect(freshGauges(e, closed, NOW)).toBe(e.gauges);
    expect(gateDecision(e, closed, NOW)).toEqual({ admit: false, reason: 'kv_pressure' });
  });

  it('reasons come in order: inflight_cap, engine_stale, engine_busy, kv_pressure', () => {
    const all = engine({
      inflight: 4,
      gauges: gauges({ running: 9, kvUsage: 1 }),
      health: 'stale',
    });
    expect(gateDecision(all, closed, NOW)).toMatchObject({ reason: 'inflight_cap' });
    expect(gateDecision({ ...all, inflight: 0 }, closed, NOW)).toMatchObject({
      reason: 'engine_stale',
    });
    expect(gateDecision({ ...all, inflight: 0, health: 'healthy' }, closed, NOW)).toMatchObject({
      reason: 'engine_busy',
    });
    const kvOnly = {
      ...all,
      inflight: 0,
      health: 'healthy' as const,
      gauges: gauges({ kvUsage: 1 }),
    };
    expect(gateDecision(kvOnly, closed, NOW)).toMatchObject({ reason: 'kv_pressure' });
  });
});

describe('frozen gauges: the probe', () => {
  // The reviewer's case: cap 4, four streams whose clients left together. vLLM ran no step
  // since, so its gauges still show the four; Sluice has none in flight any more: bypass 4.
  const policy: GatePolicy = { ...closed, frozenAfterMs: 10_000 };
  const stuck = (over: Partial<EngineGauges> = {}, view: Partial<EngineView> = {}) =>
    engine({
      gauges: gauges({
        running: 4,
        kvUsage: 0.5,
        steps: 812,
        unchangedSince: NOW - 10_000,
        ...over,
      }),
      ...view,
    });

  it('admits one engine request once the unchanged run spans the threshold, with nothing of ours in flight', () => {
    expect(bypassTraffic(stuck().gauges!)).toBe(4);
    expect(gaugesFrozen(stuck(), policy, NOW)).toBe(true);
    expect(gateDecision(stuck(), policy, NOW)).toEqual({ admit: true });
    expect(headroom(stuck(), policy, NOW)).toBe(1);
    // Measured between scrapes (at - unchangedSince), not to `now`: a moment short of it waits.
    const short = stuck({ unchangedSince: NOW - 9_999 });
    expect(gaugesFrozen(short, policy, NOW + 4_000)).toBe(false);
    expect(gateDecision(short, policy, NOW + 4_000)).toEqual({
      admit: false,
      reason: 'engine_busy',
    });
  });

  it('never beside anything of ours: with one request in flight the gauges decide again', () => {
    const probing = stuck({}, { inflight: 1 });
    expect(gaugesFrozen(probing, policy, NOW)).toBe(false);
    expect(gateDecision(probing, policy, NOW)).toEqual({ admit: false, reason: 'engine_busy' });
    expect(headroom(probing, policy, NOW)).toBe(-1);
  });

  it('a probe is one engine request: a job of several waits', () => {
    expect(gateDecision(stuck(), policy, NOW, 2)).toEqual({ admit: false, reason: 'engine_busy' });
    expect(gateDecision(stuck(), policy, NOW, 1)).toEqual({ admit: true });
  });

  it('frozen KV pressure is probed too, and the reason without a probe stays kv_pressure', () => {
    const full = stuck({ running: 0, kvUsage: 0.97 });
    expect(gateDecision(full, policy, NOW)).toEqual({ admit: true });
    expect(gateDecision(full, policy, NOW, 2)).toEqual({ admit: false, reason: 'kv_pressure' });
    expect(headroom(full, policy, NOW)).toBe(4);
  });

  it('the in-flight cap and the freshness rules hold as before', () => {
    expect(gateDecision(stuck({}, { cap: 0 }), policy, NOW)).toEqual({
      admit: false,
      reason: 'inflight_cap',
    });
    // Stale: the fail mode decides, not the probe.
    const stale = stuck({}, { health: 'stale' });
    expect(gaugesFrozen(stale, policy, NOW)).toBe(false);
    expect(gateDecision(stale, policy, NOW)).toEqual({ admit: false, reason: 'engine_stale' });
    expect(gateDecision(stuck({ at: NOW - 5_001 }), policy, NOW)).toEqual({
      admit: false,
      reason: 'engine_stale',
    });
  });

  it('never without a threshold (absent or 0), without a tracked run, or with gauges that leave the gate open', () => {
    for (const p of [closed, { ...closed, frozenAfterMs: 0 }]) {
      expect(gaugesFrozen(stuck(), p, NOW)).toBe(false);
      expect(gateDecision(stuck(), p, NOW)).toEqual({ admit: false, reason: 'engine_busy' });
    }
    for (const unchangedSince of [undefined, Number.NaN, Number.NEGATIVE_INFINITY, NOW + 1]) {
      const e = stuck({ unchangedSince });
      expect(gaugesFrozen(e, policy, NOW)).toBe(false);
      expect(gateDecision(e, policy, NOW)).toEqual({ admit: false, reason: 'engine_busy' });
    }
    // Three requests and KV below the threshold: the gate is open anyway, nothing is frozen.
    const open = stuck({ running: 3 });
    expect(gaugesFrozen(open, policy, NOW)).toBe(false);
    expect(gateDecision(open, policy, NOW)).toEqual({ admit: true });
    expect(headroom(open, policy, NOW)).toBe(1);
  });

  it('engine choice: a probe counts as one slot, so more room elsewhere goes first; a probe before nothing', () => {
    const other = engine({ name: 'b', inflight: 2 });
    expect(pickEngine([stuck(), other], policy, NOW)).toBe(1);
    // One slot each: the tie goes to the first, and the probe makes the frozen engine usable.
    expect(pickEngine([stuck(), { ...other, inflight: 3 }], policy, NOW)).toBe(0);
    expect(pickEngine([stuck(), { ...other, inflight: 4 }], policy, NOW)).toBe(0);
    expect(pickEngine([stuck()], closed, NOW)).toBe(-1);
  });
});

describe('engine choice', () => {
  it('picks the admissible engine with the most headroom, ties to the first', () => {
    expect(
      pickEngine([
        { name: 'a', inflight: 2, cap: 4 },
        { name: 'b', inflight: 0, cap: 4 },
      ]),
    ).toBe(1);
    expect(
      pickEngine([
        { name: 'a', inflight: 1, cap: 4 },
        { name: 'b', inflight: 1, cap: 4 },
      ]),
    ).toBe(0);
    expect(
      pickEngine([
        { name: 'a', inflight: 4, cap: 4 },
        { name: 'b', inflight: 8, cap: 8 },
      ]),
    ).toBe(-1);
    expect(
      pickEngine([
        { name: 'a', inflight: 4, cap: 4 },
        { name: 'b', inflight: 7, cap: 8 },
      ]),
    ).toBe(1);
    expect(pickEngine([])).toBe(-1);
  });

  it('counts bypass traffic in the headroom when the gauges are fresh', () => {
    const engines = [
      engine({ name: 'a', inflight: 0, gauges: gauges({ running: 3 }) }), // room 1
      engine({ name: 'b', inflight: 1, gauges: gauges({ running: 1, inflightAtScrape: 1 }) }), // 3
    ];
    expect(pickEngine(engines, closed, NOW)).toBe(1);
    // Without a policy the gauges are ignored: a has room 4, b 3.
    expect(pickEngine(engines)).toBe(0);
  });

  it('skips engines the gate refuses even with more headroom', () => {
    const engines = [
      engine({ name: 'a', inflight: 0, gauges: gauges({ kvUsage: 0.95 }) }),
      engine({ name: 'b', inflight: 3 }),
      engine({ name: 'c', inflight: 0, health: 'stale' }),
    ];
    expect(pickEngine(engines, closed, NOW)).toBe(1);
    // Fail open: c's stale state no longer refuses it, and it has room 4.
    expect(pickEngine(engines, openMode, NOW)).toBe(2);
  });

  it('agrees with a brute-force choice over arbitrary pools', () => {
    const view = fc.record({
      name: fc.constant('e'),
      inflight: fc.nat(10),
      cap: fc.integer({ min: 0, max: 10 }),
      gauges: fc.option(
        fc.record({
          running: fc.nat(10),
          waiting: fc.nat(10),
          kvUsage: fc.double({ min: 0, max: 1, noNaN: true }),
          at: fc.integer({ min: NOW - 10_000, max: NOW }),
          inflightAtScrape: fc.nat(10),
          unchangedSince: fc.option(fc.integer({ min: NOW - 30_000, max: NOW }), {
            nil: undefined,
          }),
        }),
        { nil: undefined },
      ),
      health: fc.constantFrom('unknown', 'healthy', 'stale', undefined),
    });
    const policy = fc.record({
      kvThreshold: fc.double({ min: 0, max: 1, noNaN: true }),
      failMode: fc.constantFrom('open' as const, 'closed' as const),
      maxGaugeAgeMs: fc.integer({ min: 0, max: 10_000 }),
      frozenAfterMs: fc.option(fc.integer({ min: 0, max: 20_000 }), { nil: undefined }),
    });
    fc.assert(
      fc.property(
        fc.array(view, { maxLength: 8 }),
        fc.option(policy, { nil: undefined }),
        (engines, p) => {
          const admissible = engines
            .map((e, i) => ({ i, ok: gateDecision(e, p, NOW).admit, room: headroom(e, p, NOW) }))
            .filter((x) => x.ok);
          const chosen = pickEngine(engines, p, NOW);
          if (admissible.length === 0) {
            expect(chosen).toBe(-1);
            return;
          }
          const most = Math.max(...admissible.map((x) => x.room));
          expect(chosen).toBe(admissible.find((x) => x.room === most)!.i);
          // An admissible engine always has at least one slot.
          expect(most).toBeGreaterThanOrEqual(1);
        },
      ),
    );
  });
});
