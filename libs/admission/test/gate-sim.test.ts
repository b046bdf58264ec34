// Property tests: a dispatcher that releases only when the gate admits, driven by arbitrary
// sequences of gauge readings, scrape failures, releases, completions and passing time.
// The oracle below restates DESIGN's policy independently of the implementation.
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import {
  gateDecision,
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
