import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { fairShareBound, VirtualTokenCounter } from '../src/fair-share.ts';

const equal = { weights: new Map<string, number>() };

/** Releases `count` picks among always-waiting tenants, each request charged in full at once. */
function serveBacklogged(
  vtc: VirtualTokenCounter,
  waiting: readonly string[],
  count: number,
  request = { input: 10, output: 5 },
): string[] {
  const picks: string[] = [];
  for (let i = 0; i < count; i++) {
    const tenant = vtc.pick(waiting)!;
    vtc.chargeInput(tenant, request.input);
    vtc.chargeOutput(tenant, request.output);
    picks.push(tenant);
  }
  return picks;
}

describe('fair share: worked examples', () => {
  it('equal weights alternate', () => {
    const vtc = new VirtualTokenCounter(equal);
    expect(serveBacklogged(vtc, ['a', 'b'], 6)).toEqual(['a', 'b', 'a', 'b', 'a', 'b']);
    // 10 input + 2 x 5 output = 20 per request, three requests each.
    expect(vtc.counter('a')).toBe(60);
    expect(vtc.counter('b')).toBe(60);
  });

  it('weight 2 gets twice the tokens of weight 1', () => {
    const vtc = new VirtualTokenCounter({ weights: new Map([['a', 2]]) });
    const picks = serveBacklogged(vtc, ['a', 'b'], 30);
    // a is charged 20 / 2 = 10 a request, b 20: a b a a b a a b ...
    expect(picks.slice(0, 8)).toEqual(['a', 'b', 'a', 'a', 'b', 'a', 'a', 'b']);
    expect(picks.filter((t) => t === 'a')).toHaveLength(20);
    expect(picks.filter((t) => t === 'b')).toHaveLength(10);
    expect(vtc.counter('a')).toBe(vtc.counter('b'));
  });

  it('lifts a tenant that returns to the lowest active counter: idle time is not banked', () => {
    const vtc = new VirtualTokenCounter(equal);
    serveBacklogged(vtc, ['a', 'b'], 4);
    serveBacklogged(vtc, ['a'], 10); // b idle while a is served alone
    expect(vtc.counter('a')).toBe(240);
    expect(vtc.counter('b')).toBe(40);
    // b returns: lifted to a's 240, so the two alternate instead of b taking ten in a row.
    expect(serveBacklogged(vtc, ['b', 'a'], 6)).toEqual(['b', 'a', 'b', 'a', 'b', 'a']);
    expect(vtc.counter('b')).toBe(300);
  });

  it('with nobody else active, a returning tenant is lifted to the one served last', () => {
    const vtc = new VirtualTokenCounter(equal);
    serveBacklogged(vtc, ['a', 'b'], 2);
    serveBacklogged(vtc, ['a'], 5); // a at 120, b at 20
    expect(vtc.pick([])).toBeUndefined(); // the queue drains
    expect(vtc.pick(['b'])).toBe('b');
    expect(vtc.counter('b')).toBe(120);
    vtc.chargeInput('b', 50);
    expect(vtc.pick([])).toBeUndefined();
    expect(vtc.pick(['a'])).toBe('a');
    expect(vtc.counter('a')).toBe(170); // b, served last, is at 170
    // A tenant already above the floor keeps its own counter.
    vtc.chargeInput('b', 30);
    expect(vtc.pick([])).toBeUndefined();
    expect(vtc.pick(['b'])).toBe('b');
    expect(vtc.counter('b')).toBe(200);
  });

  it('does not lift a tenant that kept waiting between picks', () => {
    const vtc = new VirtualTokenCounter(equal);
    expect(vtc.pick(['a', 'b'])).toBe('a');
    vtc.chargeInput('a', 100);
    expect(vtc.pick(['a', 'b'])).toBe('b');
    expect(vtc.counter('b')).toBe(0);
  });

  it('charges output twice input, both divided by the weight', () => {
    const vtc = new VirtualTokenCounter({ weights: new Map([['heavy', 2]]) });
    vtc.chargeOutput('a', 10);
    expect(vtc.counter('a')).toBe(20);
    vtc.chargeInput('a', 10);
    expect(vtc.counter('a')).toBe(30);
    vtc.chargeOutput('heavy', 10);
    vtc.chargeInput('heavy', 10);
    expect(vtc.counter('heavy')).toBe(15);
    const flat = new VirtualTokenCounter({ ...equal, inputWeight: 1, outputWeight: 1 });
    flat.chargeOutput('a', 10);
    flat.chargeInput('a', 10);
    expect(flat.counter('a')).toBe(20);
  });

  it('refunds an input charge by the weight, never below 0', () => {
    const vtc = new VirtualTokenCounter({ weights: new Map([['a', 2]]) });
    vtc.chargeInput('a', 100);
    vtc.chargeInput('a', 40);
    vtc.refundInput('a', 40);
    expect(vtc.counter('a')).toBe(50);
    vtc.refundInput('a', 1000);
    expect(vtc.counter('a')).toBe(0);
  });

  it("replaces an estimated charge with the engine's count, by weight, never below 0", () => {
    const vtc = new VirtualTokenCounter({ weights: new Map([['a', 2]]), inputWeight: 1 });
    vtc.chargeInput('a', 100);
    vtc.chargeOutput('a', 10);
    expect(vtc.counter('a')).toBe(60);
    // The prompt was 300 tokens, not the 100 estimated: 200 more at weight 2.
    vtc.correctInput('a', 100, 300);
    expect(vtc.counter('a')).toBe(160);
    // And a prompt estimated high: 260 charged, 60 real.
    vtc.chargeInput('a', 260);
    vtc.correctInput('a', 260, 60);
    expect(vtc.counter('a')).toBe(190);
    vtc.correctInput('a', 10_000, 0);
    expect(vtc.counter('a')).toBe(0);
    expect(() => vtc.correctInput('a', 1, Number.NaN)).toThrow(RangeError);
    // Output counted as it streamed (weighted twice), corrected to the engine's count.
    vtc.chargeOutput('a', 11);
    vtc.correctOutput('a', 11, 10);
    expect(vtc.counter('a')).toBe(10);
  });

  it('ties go to the tenant named first', () => {
    const vtc = new VirtualTokenCounter(equal);
    expect(vtc.pick(['b', 'a'])).toBe('b');
    expect(vtc.pick(['a', 'b'])).toBe('a');
    vtc.chargeInput('a', 1);
    expect(vtc.pick(['a', 'b'])).toBe('b');
    expect(vtc.pick([])).toBeUndefined();
  });

  it('snapshot restores; a new leader evens up the tenants waiting at its first pick', () => {
    const vtc = new VirtualTokenCounter(equal);
    serveBacklogged(vtc, ['a', 'b'], 3);
    serveBacklogged(vtc, ['a'], 6);
    const saved = vtc.snapshot();
    expect(saved).toEqual({ a: 160, b: 20 });
    saved.a = 0; // a copy: changing it changes nothing
    expect(vtc.counter('a')).toBe(160);

    const next = new VirtualTokenCounter(equal, vtc.snapshot());
    expect(next.counter('a')).toBe(160);
    // Who was active is unknown after a restore: b, idle at 20, must not get 140 tokens of the
    // engine to itself, so both start at 160.
    expect(serveBacklogged(next, ['a', 'b'], 4)).toEqual(['a', 'b', 'a', 'b']);
    expect(next.counter('b')).toBe(200);
  });

  it('restored with its state, goes on exactly where the previous instance stopped', () => {
    const vtc = new VirtualTokenCounter(equal);
    serveBacklogged(vtc, ['a', 'b'], 3);
    vtc.chargeInput('a', 100); // a's request in flight ran long: b is behind while both wait
    expect(vtc.state()).toEqual({ active: ['a', 'b'], lastServed: 'a' });
    const next = new VirtualTokenCounter(equal, vtc.snapshot(), vtc.state());
    const same = new VirtualTokenCounter(equal, vtc.snapshot(), vtc.state());
    // b was waiting all along: it is not lifted, and gets the turns it is owed.
    expect(serveBacklogged(next, ['a', 'b'], 6)).toEqual(serveBacklogged(vtc, ['a', 'b'], 6));
    expect(serveBacklogged(same, ['a', 'b'], 2)).toEqual(['b', 'b']);
  });

  it('refuses bad numbers with a RangeError', () => {
    const vtc = new VirtualTokenCounter(equal);
    for (const bad of [-1, Number.NaN, Number.POSITIVE_INFINITY]) {
      expect(() => vtc.chargeInput('a', bad)).toThrow(RangeError);
      expect(() => vtc.chargeOutput('a', bad)).toThrow(
        /output tokens must be a finite number >= 0/,
      );
      expect(() => new VirtualTokenCounter(equal, { a: bad })).toThrow(RangeError);
      expect(() =>
        fairShareBound({ maxInputTokens: bad, maxOutputTokens: 1, concurrency: 1 }),
      ).toThrow(RangeError);
    }
    expect(vtc.counter('a')).toBe(0);
    for (const weight of [0, -2, Number.NaN]) {
      expect(() => new VirtualTokenCounter({ weights: new Map([['a', weight]]) })).toThrow(
        /weight of tenant "a" must be > 0/,
      );
      const args = { maxInputTokens: 1, maxOutputTokens: 1, concurrency: 1, minWeight: weight };
      expect(() => fairShareBound(args)).toThrow(RangeError);
    }
    expect(() => new VirtualTokenCounter({ ...equal, outputWeight: -1 })).toThrow(RangeError);
    expect(() => vtc.pick(['a', 'b', 'a'])).toThrow(/names a tenant twice/);
  });

  it('the bound: cap 2, prompts up to 2,000 tokens, answers up to 500', () => {
    // 2 x (1 x 2,000 + 2 x 2 x 500) = 8,000 weighted tokens, under three full requests.
    expect(fairShareBound({ maxInputTokens: 2000, maxOutputTokens: 500, concurrency: 2 })).toBe(
      8000,
    );
    const half = { maxInputTokens: 2000, maxOutputTokens: 500, concurrency: 2, minWeight: 0.5 };
    expect(fairShareBound(half)).toBe(16000);
    const flat = { ...half, minWeight: 1, inputWeight: 1, outputWeight: 1 };
    expect(fairShareBound(flat)).toBe(6000);
  });
});

// A small discrete engine: `concurrency` slots; when one is free the next request is released
// from the tenant `pick` names and its input charged; each step every request in flight
// streams `chunk` output tokens, charged as they come. Weights are powers of two so every
// weighted charge is exact and the bounds can be asserted without a tolerance.
interface Arrival {
  tenant: number;
  input: number;
  output: number;
}

interface Scenario {
  concurrency: number;
  weights: number[];
  maxInput: number;
  maxOutput: number;
  chunk: number;
  /** Call `pick([])` when a slot is free and nothing waits (the queue drained), or not. */
  pollEmpty: boolean;
  /** Name the waiting tenants in a rotating order, so ties fall differently. */
  rotate: boolean;
  /** Arrivals at each step; the run continues until every request completed. */
  steps: Arrival[][];
}

interface SimView {
  /** Weighted tokens charged so far, per tenant: the service, counted by the test. */
  served: number[];
  queued: number[];
}

interface Hooks {
  /** Before `pick`, with the tenants about to be named. */
  picking?(waiting: readonly number[]): void;
  /** After `pick` lifted and chose (undefined: nothing waiting), before the input is charged. */
  picked(tenant: number | undefined, waiting: readonly number[]): void;
  /** After every charge: a release, or a step of output. */
  settled(): void;
}

const name = (tenant: number) => `t${tenant}`;

function counterFor(s: Scenario): VirtualTokenCounter {
  return new VirtualTokenCounter({ weights: new Map(s.weights.map((w, t) => [name(t), w])) });
}

function simulate(s: Scenario, vtc: VirtualTokenCounter, view: SimView, hooks: Hooks): void {
  const queues: Arrival[][] = s.weights.map(() => []);
  let inflight: { tenant: number; left: number }[] = [];
  for (
    let step = 0;
    step < s.steps.length || inflight.length > 0 || view.queued.some((q) => q > 0);
    step++
  ) {
    for (const arrival of s.steps[step] ?? []) queues[arrival.tenant]!.push(arrival);
    view.queued = queues.map((q) => q.length);
    while (inflight.length < s.concurrency) {
      const shift = s.rotate ? step % s.weights.length : 0;
      const order = s.weights.map((_, i) => (i + shift) % s.weights.length);
      const waiting = order.filter((t) => queues[t]!.length > 0);
      if (waiting.length === 0 && !s.pollEmpty) break;
      hooks.picking?.(waiting);
      const picked = vtc.pick(waiting.map(name));
      const tenant = picked === undefined ? undefined : Number(picked.slice(1));
      hooks.picked(tenant, waiting);
      if (tenant === undefined) break;
      const request = queues[tenant]!.shift()!;
      view.queued = queues.map((q) => q.length);
      vtc.chargeInput(name(tenant), request.input);
      view.served[tenant]! += request.input / s.weights[tenant]!;
      inflight.push({ tenant, left: request.output });
      hooks.settled();
    }
    for (const request of inflight) {
      const tokens = Math.min(request.left, s.chunk);
      if (tokens === 0) continue;
      vtc.chargeOutput(name(request.tenant), tokens);
      view.served[request.tenant]! += (2 * tokens) / s.weights[request.tenant]!;
      request.left -= tokens;
    }
    inflight = inflight.filter((request) => request.left > 0);
    hooks.settled();
  }
}

/**
 * Runs a scenario and checks, at every release and every step of output:
 * (1) two tenants backlogged (queue never empty) since a pick t1: their service since t1
 *     differs by at most the bound;
 * (2) a tenant that becomes active is released within a bounded number of releases to the
 *     others, and until then no other tenant gets more than the bound from its first release
 *     in that window;
 * (3) no tenant gets more than bound/2 x weight / w_p + 1 releases in a row while another
 *     waits: a returning tenant does not take the engine.
 * The limits of (2) and (3) follow from the bound's U (see `fairShareBound`): a tenant that
 * is picked has the smallest counter, each release raises a counter by at least w_p x 1 token
 * / weight, and a tenant that becomes active starts at the smallest active counter.
 * Returns how many comparisons were made, so a caller can tell the checks were not vacuous.
 */
function checkFairness(
  s: Scenario,
  observe: Partial<Pick<Hooks, 'picking' | 'picked'>> & { vtc?: VirtualTokenCounter } = {},
): { pairs: number; windows: number } {
  const bound = fairShareBound({
    maxInputTokens: s.maxInput,
    maxOutputTokens: s.maxOutput,
    concurrency: s.concurrency,
    minWeight: Math.min(...s.weights),
  });
  const vtc = observe.vtc ?? counterFor(s);
  const view: SimView = { served: s.weights.map(() => 0), queued: s.weights.map(() => 0) };
  const tenants = s.weights.map((_, t) => t);
  const backlogSince: (number | undefined)[] = [];
  const servedAtPick: number[][] = [];
  let previous = new Set<number>();
  const windows = new Map<number, { releases: number; firstRelease: Map<number, number> }>();
  let run = { tenant: -1, length: 0 };
  const counts = { pairs: 0, windows: 0 };

  simulate(s, vtc, view, {
    picking: observe.picking,
    picked(tenant, waiting) {
      observe.picked?.(tenant, waiting);
      const pick = servedAtPick.push([...view.served]) - 1;
      for (const t of waiting) backlogSince[t] ??= pick;
      for (const t of waiting) {
        if (!previous.has(t)) windows.set(t, { releases: 0, firstRelease: new Map() });
      }
      previous = new Set(waiting);
      if (tenant === undefined) return;
      windows.delete(tenant);
      for (const window of windows.values()) {
        window.releases++;
        if (!window.firstRelease.has(tenant)) window.firstRelease.set(tenant, view.served[tenant]!);
      }
      const othersWait = waiting.length > 1;
      run = othersWait
        ? { tenant, length: run.tenant === tenant ? run.length + 1 : 1 }
        : { tenant: -1, length: 0 };
      if (othersWait) {
        expect(run.length).toBeLessThanOrEqual(Math.floor((bound / 2) * s.weights[tenant]!) + 1);
      }
    },
    settled() {
      for (const t of tenants) if (view.queued[t] === 0) backlogSince[t] = undefined;
      for (const f of tenants) {
        for (const g of tenants) {
          const since = Math.max(backlogSince[f] ?? Infinity, backlogSince[g] ?? Infinity);
          if (f >= g || since === Infinity) continue;
          const serviceF = view.served[f]! - servedAtPick[since]![f]!;
          const serviceG = view.served[g]! - servedAtPick[since]![g]!;
          expect(Math.abs(serviceF - serviceG)).toBeLessThanOrEqual(bound);
          counts.pairs++;
        }
      }
      for (const [returning, window] of windows) {
        const others = tenants.filter((t) => t !== returning);
        const allowed = others.reduce(
          (sum, g) => sum + Math.floor((bound / 2) * s.weights[g]!) + 1,
          0,
        );
        expect(window.releases).toBeLessThanOrEqual(allowed);
        for (const [g, before] of window.firstRelease) {
          expect(view.served[g]! - before).toBeLessThanOrEqual(bound);
        }
        counts.windows++;
      }
    },
  });
  return counts;
}

const arrival = fc.record({ tenant: fc.nat(), input: fc.nat(), output: fc.nat() });

const scenario: fc.Arbitrary<Scenario> = fc
  .record({
    concurrency: fc.integer({ min: 1, max: 4 }),
    weights: fc.array(fc.constantFrom(1, 2, 4), { minLength: 2, maxLength: 4 }),
    maxInput: fc.integer({ min: 1, max: 40 }),
    maxOutput: fc.integer({ min: 0, max: 20 }),
    chunk: fc.integer({ min: 1, max: 3 }),
    pollEmpty: fc.boolean(),
    rotate: fc.boolean(),
    // Quiet steps between bursts, so tenants go idle and come back.
    steps: fc.array(fc.oneof(fc.constant([]), fc.array(arrival, { maxLength: 5 })), {
      minLength: 1,
      maxLength: 60,
    }),
  })
  .map((s) => ({
    ...s,
    steps: s.steps.map((arrivals) =>
      arrivals.map((a) => ({
        tenant: a.tenant % s.weights.length,
        input: 1 + (a.input % s.maxInput),
        output: a.output % (s.maxOutput + 1),
      })),
    ),
  }));

describe('fair share: properties over random arrivals', () => {
  it('backlogged tenants stay within the bound; returning tenants neither starve nor starve others', () => {
    const total = { pairs: 0, windows: 0 };
    fc.assert(
      fc.property(scenario, (s) => {
        const counts = checkFairness(s);
        total.pairs += counts.pairs;
        total.windows += counts.windows;
      }),
      { numRuns: 300 },
    );
    expect(total.pairs).toBeGreaterThan(0);
    expect(total.windows).toBeGreaterThan(0);
  });
});

describe('fair share: a tenant that returns after a long idle', () => {
  // Tenant 0 sends a few requests, then nothing while the others are served alone for long
  // enough that their counters pass its own by more than the bound; then it floods. It must
  // be lifted (not bank the idle time and take the engine), and served soon.
  const returning: fc.Arbitrary<Scenario> = fc
    .record({
      concurrency: fc.integer({ min: 1, max: 3 }),
      weights: fc.array(fc.constantFrom(1, 2), { minLength: 2, maxLength: 3 }),
      maxInput: fc.integer({ min: 1, max: 20 }),
      maxOutput: fc.integer({ min: 1, max: 10 }),
      early: fc.integer({ min: 1, max: 3 }),
      comeback: fc.integer({ min: 1, max: 40 }),
      sizes: fc.array(fc.record({ input: fc.nat(), output: fc.nat() }), {
        minLength: 1,
        maxLength: 20,
      }),
    })
    .map((r) => {
      const bound = fairShareBound({
        maxInputTokens: r.maxInput,
        maxOutputTokens: r.maxOutput,
        concurrency: r.concurrency,
      });
      // Every step the busy slots stream at least one token each (2 / weight <= 2 weighted
      // tokens); shared by at most two others within the bound, so this many steps lifts
      // their smallest counter past tenant 0's by more than the bound.
      const idle = Math.ceil((4 * bound + 4 * r.maxInput) / r.concurrency) + 10;
      let n = 0;
      const request = (tenant: number): Arrival => {
        const size = r.sizes[n++ % r.sizes.length]!;
        return {
          tenant,
          input: 1 + (size.input % r.maxInput),
          output: 1 + (size.output % r.maxOutput),
        };
      };
      const flood = r.concurrency * (idle + 2 * bound);
      const others = r.weights
        .slice(1)
        .flatMap((_, i) => Array.from({ length: flood }, () => request(i + 1)));
      const steps: Arrival[][] = Array.from({ length: idle + 1 }, () => []);
      steps[0] = [...Array.from({ length: r.early }, () => request(0)), ...others];
      steps[idle] = Array.from({ length: r.comeback }, () => request(0));
      return {
        concurrency: r.concurrency,
        weights: r.weights,
        maxInput: r.maxInput,
        maxOutput: r.maxOutput,
        chunk: 1,
        pollEmpty: false,
        rotate: false,
        steps,
      };
    });

  it('is lifted to the smallest active counter, served within the bound, and takes no more than its share', () => {
    fc.assert(
      fc.property(returning, (s) => {
        const vtc = counterFor(s);
        let wasActive = false;
        let before: { own: number; othersMin: number } | undefined;
        let lifted = 0;
        checkFairness(s, {
          vtc,
          picking(waiting) {
            const active = waiting.includes(0);
            if (active && !wasActive && lifted === 0 && vtc.counter('t0') > 0) {
              const others = waiting.filter((t) => t !== 0).map((t) => vtc.counter(name(t)));
              before = { own: vtc.counter('t0'), othersMin: Math.min(...others) };
            }
            wasActive = active;
          },
          picked() {
            if (before === undefined || lifted !== 0) return;
            expect(before.othersMin).toBeGreaterThan(before.own);
            expect(vtc.counter('t0')).toBe(before.othersMin);
            lifted = before.othersMin - before.own;
          },
        });
        // The scenario did exercise the lift, by more than the bound.
        const bound = fairShareBound({
          maxInputTokens: s.maxInput,
          maxOutputTokens: s.maxOutput,
          concurrency: s.concurrency,
        });
        expect(lifted).toBeGreaterThan(bound);
      }),
      { numRuns: 40 },
    );
  });
});
