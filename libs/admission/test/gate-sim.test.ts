// Property tests: a dispatcher that releases only when the gate admits, driven by arbitrary
// sequences of gauge readings, scrape failures, releases, completions and passing time.
// The oracle below restates DESIGN's policy independently of the implementation. The last
// group adds frozen gauges (scrapes that repeat themselves) and the probe.
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { unchangedSince } from '../src/frozen.ts';
import {
  gateDecision,
  gaugesFrozen,
  headroom,
  pickEngine,
  type EngineGauges,
  type EngineView,
  type GatePolicy,
} from '../src/gate.ts';

type Event =
  | { kind: 'scrape'; running: number; waiting: number; kv: number }
  | { kind: 'scrapeFail' }
  | { kind: 'release' }
  | { kind: 'complete' }
  | { kind: 'tick'; ms: number };

const kv = fc.oneof(
  fc.double({ min: 0, max: 1, noNaN: true }),
  fc.constantFrom(0, 0.5, 0.8, 0.9, 0.95, 1),
);

const event: fc.Arbitrary<Event> = fc.oneof(
  {
    arbitrary: fc.record({
      kind: fc.constant('scrape' as const),
      // Small readings often fall within the broker's own in-flight (no bypass).
      running: fc.oneof(fc.nat(3), fc.nat(24)),
      waiting: fc.oneof(fc.constant(0), fc.nat(8)),
      kv,
    }),
    weight: 3,
  },
  { arbitrary: fc.constant({ kind: 'scrapeFail' as const }), weight: 1 },
  { arbitrary: fc.constant({ kind: 'release' as const }), weight: 6 },
  { arbitrary: fc.constant({ kind: 'complete' as const }), weight: 3 },
  { arbitrary: fc.record({ kind: fc.constant('tick' as const), ms: fc.nat(4_000) }), weight: 2 },
);

const policy: fc.Arbitrary<GatePolicy> = fc.record({
  kvThreshold: fc.oneof(fc.double({ min: 0.05, max: 1, noNaN: true }), fc.constantFrom(0.9, 1)),
  failMode: fc.constantFrom('open' as const, 'closed' as const),
  maxGaugeAgeMs: fc.integer({ min: 500, max: 8_000 }),
});

interface Sim {
  now: number;
  inflight: number;
  cap: number;
  gauges?: EngineGauges;
  health: 'unknown' | 'healthy' | 'stale';
}

function view(s: Sim): EngineView {
  return { name: 'e', inflight: s.inflight, cap: s.cap, gauges: s.gauges, health: s.health };
}

/** Independent restatement: gauges present, observer healthy, no older than the limit. */
function fresh(s: Sim, p: GatePolicy): s is Sim & { gauges: EngineGauges } {
  return s.health === 'healthy' && s.gauges !== undefined && s.now - s.gauges.at <= p.maxGaugeAgeMs;
}

/** Applies one event the way a gate-obeying dispatcher and its observer would. */
function step(s: Sim, e: Event, p: GatePolicy): void {
  switch (e.kind) {
    case 'scrape':
      s.gauges = {
        running: e.running,
        waiting: e.waiting,
        kvUsage: e.kv,
        at: s.now,
        inflightAtScrape: s.inflight,
      };
      s.health = 'healthy';
      break;
    case 'scrapeFail':
      s.health = 'stale';
      break;
    case 'release':
      if (gateDecision(view(s), p, s.now).admit) s.inflight += 1;
      break;
    case 'complete':
      if (s.inflight > 0) s.inflight -= 1;
      break;
    case 'tick':
      s.now += e.ms;
      break;
  }
}

const T0 = 1_700_000_000_000;

describe('gate over arbitrary event sequences', () => {
  it('holds DESIGN policy after every event', () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 1, max: 16 }),
        policy,
        fc.array(event, { maxLength: 300, size: 'max' }),
        (cap, p, events) => {
          const s: Sim = { now: T0, inflight: 0, cap, health: 'unknown' };
          for (const e of events) {
            step(s, e, p);
            const d = gateDecision(view(s), p, s.now);

            // (1) The broker never has more than the cap in flight.
            expect(s.inflight).toBeLessThanOrEqual(cap);
            if (s.inflight >= cap) expect(d).toEqual({ admit: false, reason: 'inflight_cap' });

            if (fresh(s, p)) {
              // (2) Closed whenever fresh KV usage is at or above the threshold.
              if (s.gauges.kvUsage >= p.kvThreshold) expect(d.admit).toBe(false);
              const bypass = s.gauges.running + s.gauges.waiting - s.gauges.inflightAtScrape;
              if (s.inflight + Math.max(0, bypass) >= cap) expect(d.admit).toBe(false);
              // (4) Fresh, no bypass traffic, KV fine: open exactly while inflight < cap.
              if (bypass <= 0 && s.gauges.kvUsage < p.kvThreshold) {
                expect(d.admit).toBe(s.inflight < cap);
              }
            } else if (p.failMode === 'closed') {
              // (3) Fail mode closed admits nothing on stale or unknown state.
              expect(d.admit).toBe(false);
            } else {
              // Fail mode open: only the in-flight cap applies.
              expect(d.admit).toBe(s.inflight < cap);
            }
          }
        },
      ),
      { numRuns: 300 },
    );
  });

  it('with fresh gauges and no bypass traffic the gate does not close spuriously', () => {
    // The engine reports only the broker's own requests (possibly fewer, not yet arrived),
    // KV below the threshold; scrapes come often enough to stay fresh.
    const quiet = fc.oneof(
      {
        arbitrary: fc.record({
          kind: fc.constant('scrape' as const),
          seen: fc.double({ min: 0, max: 1, noNaN: true }),
          waitingShare: fc.double({ min: 0, max: 1, noNaN: true }),
        }),
        weight: 2,
      },
      { arbitrary: fc.constant({ kind: 'release' as const }), weight: 5 },
      { arbitrary: fc.constant({ kind: 'complete' as const }), weight: 3 },
      { arbitrary: fc.record({ kind: fc.constant('tick' as const), ms: fc.nat(400) }), weight: 1 },
    );
    fc.assert(
      fc.property(
        fc.integer({ min: 1, max: 16 }),
        fc.constantFrom('open' as const, 'closed' as const),
        fc.array(quiet, { maxLength: 300, size: 'max' }),
        (cap, failMode, events) => {
          const p: GatePolicy = { kvThreshold: 0.9, failMode, maxGaugeAgeMs: 1_000_000 };
          const s: Sim = { now: T0, inflight: 0, cap, health: 'unknown' };
          step(s, { kind: 'scrape', running: 0, waiting: 0, kv: 0 }, p);
          for (const e of events) {
            if (e.kind === 'scrape') {
              const total = Math.floor(e.seen * s.inflight);
              const waiting = Math.floor(total * e.waitingShare);
              step(s, { kind: 'scrape', running: total - waiting, waiting, kv: 0.5 }, p);
            } else {
              const before = s.inflight;
              step(s, e, p);
              if (e.kind === 'release') expect(s.inflight).toBe(before < cap ? before + 1 : before);
            }
            expect(gateDecision(view(s), p, s.now).admit).toBe(s.inflight < cap);
          }
        },
      ),
      { numRuns: 300 },
    );
  });

  it('keeps the engine at or below the cap, but for bypass traffic newer than the scrape', () => {
    // A truthful engine: running + waiting = broker in-flight + bypass, and every scrape
    // reads it exactly. Bypass traffic changes at any time. After each release made on
    // fresh gauges, engine load <= cap + (bypass growth since the last scrape): the lag of
    // one scrape interval, in the direction of over-admission.
    type Ev = Event | { kind: 'bypass'; delta: number };
    const ev: fc.Arbitrary<Ev> = fc.oneof(
      { arbitrary: event, weight: 4 },
      {
        arbitrary: fc.record({
          kind: fc.constant('bypass' as const),
          delta: fc.integer({ min: -3, max: 3 }),
        }),
        weight: 1,
      },
    );
    fc.assert(
      fc.property(
        fc.integer({ min: 1, max: 16 }),
        policy,
        fc.array(ev, { maxLength: 300, size: 'max' }),
        (cap, p, events) => {
          const s: Sim = { now: T0, inflight: 0, cap, health: 'unknown' };
          let bypass = 0;
          let bypassAtScrape = 0;
          for (const e of events) {
            if (e.kind === 'bypass') {
              bypass = Math.max(0, bypass + e.delta);
            } else if (e.kind === 'scrape') {
              bypassAtScrape = bypass;
              const total = s.inflight + bypass;
              step(s, { ...e, running: total, waiting: 0 }, p);
            } else if (e.kind === 'release') {
              const wasFresh = fresh(s, p);
              const before = s.inflight;
              step(s, e, p);
              if (wasFresh && s.inflight > before) {
                const growth = Math.max(0, bypass - bypassAtScrape);
                expect(s.inflight + bypass).toBeLessThanOrEqual(cap + growth);
              }
            } else {
              step(s, e, p);
            }
          }
        },
      ),
      { numRuns: 300 },
    );
  });

  it('a pool dispatcher releasing through pickEngine never exceeds any cap', () => {
    const poolEvent = fc.record({ engine: fc.nat(3), event });
    fc.assert(
      fc.property(
        fc.array(fc.integer({ min: 1, max: 8 }), { minLength: 1, maxLength: 4 }),
        policy,
        fc.array(poolEvent, { maxLength: 300, size: 'max' }),
        (caps, p, events) => {
          let now = T0;
          const sims: Sim[] = caps.map((cap) => ({ now, inflight: 0, cap, health: 'unknown' }));
          for (const { engine, event: e } of events) {
            if (e.kind === 'tick') {
              now += e.ms;
              for (const s of sims) s.now = now;
            } else if (e.kind === 'release') {
              const i = pickEngine(sims.map(view), p, now);
              if (i !== -1) {
                expect(gateDecision(view(sims[i]!), p, now).admit).toBe(true);
                sims[i]!.inflight += 1;
              } else {
                for (const s of sims) expect(gateDecision(view(s), p, now).admit).toBe(false);
              }
            } else {
              step(sims[engine % sims.length]!, e, p);
            }
            for (const s of sims) expect(s.inflight).toBeLessThanOrEqual(s.cap);
          }
        },
      ),
      { numRuns: 200 },
    );
  });
});

// Frozen gauges (gate.ts): an engine whose scrapes repeat the same reading, step counter
// included, with nothing of the broker's in flight, gets one probe once the run of identical
// scrapes spans `frozenAfterMs`. The simulated observer keeps `unchangedSince` as the
// dispatcher does (frozen.ts).
type FrozenEvent =
  | { kind: 'scrape'; running: number; waiting: number; kv: number; steps: number }
  | { kind: 'same' }
  | { kind: 'scrapeFail' }
  | { kind: 'release'; sequences: number }
  | { kind: 'complete' }
  | { kind: 'tick'; ms: number };

const frozenEvent: fc.Arbitrary<FrozenEvent> = fc.oneof(
  {
    arbitrary: fc.record({
      kind: fc.constant('scrape' as const),
      running: fc.oneof(fc.nat(3), fc.nat(24)),
      waiting: fc.oneof(fc.constant(0), fc.nat(8)),
      kv,
      // Few values, so that a new scrape often reads the same as the last one.
      steps: fc.nat(3),
    }),
    weight: 2,
  },
  // The same reading again: what an engine that runs no step shows.
  { arbitrary: fc.constant({ kind: 'same' as const }), weight: 4 },
  { arbitrary: fc.constant({ kind: 'scrapeFail' as const }), weight: 1 },
  {
    arbitrary: fc.record({
      kind: fc.constant('release' as const),
      sequences: fc.oneof(fc.constant(1), fc.integer({ min: 1, max: 3 })),
    }),
    weight: 5,
  },
  { arbitrary: fc.constant({ kind: 'complete' as const }), weight: 3 },
  { arbitrary: fc.record({ kind: fc.constant('tick' as const), ms: fc.nat(3_000) }), weight: 3 },
);

const frozenPolicy: fc.Arbitrary<GatePolicy> = fc.record({
  kvThreshold: fc.oneof(fc.double({ min: 0.05, max: 1, noNaN: true }), fc.constantFrom(0.9, 1)),
  failMode: fc.constantFrom('open' as const, 'closed' as const),
  maxGaugeAgeMs: fc.integer({ min: 2_000, max: 20_000 }),
  frozenAfterMs: fc.oneof(fc.constant(0), fc.integer({ min: 1, max: 10_000 })),
});

/** The gate as it was before the probe: the same policy without a threshold. */
const withoutProbe = (p: GatePolicy): GatePolicy => ({ ...p, frozenAfterMs: undefined });

/** A scrape as the dispatcher takes it in: `unchangedSince` from the previous one. */
function scrapeInto(s: Sim, reading: Omit<EngineGauges, 'at' | 'inflightAtScrape'>): void {
  const next = { ...reading, at: s.now };
  s.gauges = {
    ...next,
    inflightAtScrape: s.inflight,
    unchangedSince: unchangedSince(s.gauges, next),
  };
  s.health = 'healthy';
}

describe('frozen gauges over arbitrary event sequences', () => {
  it('a probe goes only with nothing of ours in flight, one engine request, after the threshold; the cap holds', () => {
    let probes = 0;
    let kvProbes = 0;
    fc.assert(
      fc.property(
        fc.integer({ min: 1, max: 8 }),
        frozenPolicy,
        fc.array(frozenEvent, { maxLength: 300, size: 'max' }),
        (cap, p, events) => {
          const s: Sim = { now: T0, inflight: 0, cap, health: 'unknown' };
          for (const e of events) {
            if (e.kind === 'scrape') {
              scrapeInto(s, {
                running: e.running,
                waiting: e.waiting,
                kvUsage: e.kv,
                steps: e.steps,
              });
            } else if (e.kind === 'same') {
              if (s.gauges) scrapeInto(s, s.gauges);
            } else if (e.kind === 'release') {
              const d = gateDecision(view(s), p, s.now, e.sequences);
              const before = gateDecision(view(s), withoutProbe(p), s.now, e.sequences);
              // The probe only ever adds an admission; it never refuses what was admitted.
              if (before.admit) expect(d).toEqual(before);
              if (d.admit && !before.admit) {
                probes += 1;
                if (s.gauges!.kvUsage >= p.kvThreshold) kvProbes += 1;
                // (a) At most one engine request of ours on the engine: none before it, one.
                expect(s.inflight).toBe(0);
                expect(e.sequences).toBe(1);
                expect(fresh(s, p)).toBe(true);
                expect(p.frozenAfterMs).toBeGreaterThan(0);
                expect(s.gauges!.at - s.gauges!.unchangedSince!).toBeGreaterThanOrEqual(
                  p.frozenAfterMs!,
                );
                expect(gaugesFrozen(view(s), p, s.now)).toBe(true);
              }
              if (d.admit) s.inflight += e.sequences;
            } else {
              step(s, e, p);
            }
            // (b) The cap holds, probe or not.
            expect(s.inflight).toBeLessThanOrEqual(cap);
            // (c) With a probe of ours in flight, nothing else goes past the gauges.
            if (s.inflight > 0) {
              expect(gaugesFrozen(view(s), p, s.now)).toBe(false);
              expect(gateDecision(view(s), p, s.now)).toEqual(
                gateDecision(view(s), withoutProbe(p), s.now),
              );
            }
          }
        },
      ),
      { numRuns: 300 },
    );
    // Not vacuous: the runs probed, past engine_busy and past kv_pressure.
    expect(probes).toBeGreaterThan(0);
    expect(kvProbes).toBeGreaterThan(0);
  });

  it('with truthful gauges of an engine that steps while it holds requests, the gate decides exactly as before', () => {
    // The engine holds the broker's requests plus bypass traffic that changes at any time;
    // every scrape reads it exactly, and its step counter moves whenever it held anything
    // since the last scrape (a running engine steps continuously).
    type Ev = FrozenEvent | { kind: 'bypass'; delta: number };
    const ev: fc.Arbitrary<Ev> = fc.oneof(
      { arbitrary: frozenEvent, weight: 5 },
      {
        arbitrary: fc.record({
          kind: fc.constant('bypass' as const),
          delta: fc.integer({ min: -3, max: 3 }),
        }),
        weight: 2,
      },
    );
    fc.assert(
      fc.property(
        fc.integer({ min: 1, max: 8 }),
        frozenPolicy,
        fc.double({ min: 0, max: 0.3, noNaN: true }),
        fc.array(ev, { maxLength: 300, size: 'max' }),
        (cap, p, kvPerRequest, events) => {
          const s: Sim = { now: T0, inflight: 0, cap, health: 'unknown' };
          let bypass = 0;
          let steps = 0;
          let heldSinceScrape = false;
          const load = () => s.inflight + bypass;
          for (const e of events) {
            if (e.kind === 'bypass') bypass = Math.max(0, bypass + e.delta);
            else if (e.kind === 'scrape' || e.kind === 'same') {
              if (heldSinceScrape || load() > 0) steps += 1;
              heldSinceScrape = load() > 0;
              scrapeInto(s, {
                running: load(),
                waiting: 0,
                kvUsage: Math.min(1, load() * kvPerRequest),
                steps,
              });
            } else if (e.kind === 'release') {
              const d = gateDecision(view(s), p, s.now, e.sequences);
              if (d.admit) s.inflight += e.sequences;
            } else step(s, e, p);
            heldSinceScrape ||= load() > 0;
            for (const sequences of [1, 2]) {
              expect(gateDecision(view(s), p, s.now, sequences)).toEqual(
                gateDecision(view(s), withoutProbe(p), s.now, sequences),
              );
            }
            expect(headroom(view(s), p, s.now)).toBe(headroom(view(s), withoutProbe(p), s.now));
            expect(gaugesFrozen(view(s), p, s.now)).toBe(false);
          }
        },
      ),
      { numRuns: 300 },
    );
  });

  it('a pool dispatcher releasing through pickEngine never exceeds any cap, and probes one engine request at a time', () => {
    const poolEvent = fc.record({ engine: fc.nat(3), event: frozenEvent });
    fc.assert(
      fc.property(
        fc.array(fc.integer({ min: 1, max: 6 }), { minLength: 1, maxLength: 4 }),
        frozenPolicy,
        fc.array(poolEvent, { maxLength: 300, size: 'max' }),
        (caps, p, events) => {
          let now = T0;
          const sims: Sim[] = caps.map((cap) => ({ now, inflight: 0, cap, health: 'unknown' }));
          for (const { engine, event: e } of events) {
            const s = sims[engine % sims.length]!;
            if (e.kind === 'tick') {
              now += e.ms;
              for (const x of sims) x.now = now;
            } else if (e.kind === 'release') {
              const i = pickEngine(sims.map(view), p, now);
              if (i !== -1) {
                const chosen = sims[i]!;
                const probe = !gateDecision(view(chosen), withoutProbe(p), now).admit;
                expect(gateDecision(view(chosen), p, now).admit).toBe(true);
                if (probe) expect(chosen.inflight).toBe(0);
                chosen.inflight += 1;
              } else {
                for (const x of sims) expect(gateDecision(view(x), p, now).admit).toBe(false);
              }
            } else if (e.kind === 'scrape') {
              scrapeInto(s, {
                running: e.running,
                waiting: e.waiting,
                kvUsage: e.kv,
                steps: e.steps,
              });
            } else if (e.kind === 'same') {
              if (s.gauges) scrapeInto(s, s.gauges);
            } else {
              step(s, e, p);
            }
            for (const x of sims) expect(x.inflight).toBeLessThanOrEqual(x.cap);
          }
        },
      ),
      { numRuns: 200 },
    );
  });
});
