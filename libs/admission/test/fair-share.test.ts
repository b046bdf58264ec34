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

  it('refuses bad numbers with a RangeError', () => {
    const vtc = new VirtualTokenCounter(equal);
    for (const bad of [-1, Number.NaN, Number.POSITIVE_INFINITY]) {
      expect(() => vtc.chargeInput('a', bad)).toThrow(RangeError);
      expect(() => vtc.chargeOutput('a', bad)).toThrow(/output tokens must be a finite number >= 0/);
      expect(() => new VirtualTokenCounter(equal, { a: bad })).toThrow(RangeError);
      expect(() => fairShareBound({ maxInputTokens: bad, maxOutputTokens: 1, concurrency: 1 })).toThrow(
        RangeError,
      );
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
    expect(fairShareBound({ maxInputTokens: 2000, maxOutputTokens: 500, concurrency: 2 })).toBe(8000);
    const half = { maxInputTokens: 2000, maxOutputTokens: 500, concurrency: 2, minWeight: 0.5 };
    expect(fairShareBound(half)).toBe(16000);
    const flat = { ...half, minWeight: 1, inputWeight: 1, outputWeight: 1 };
    expect(fairShareBound(flat)).toBe(6000);
  });
});
