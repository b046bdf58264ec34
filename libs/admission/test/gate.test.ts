import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { gateDecision, pickEngine } from '../src/gate.ts';

describe('gate', () => {
  it('admits below the cap and refuses at or above it, whatever the numbers', () => {
    fc.assert(
      fc.property(fc.nat(1000), fc.integer({ min: 1, max: 1000 }), (inflight, cap) => {
        const decision = gateDecision({ name: 'e', inflight, cap });
        expect(decision.admit).toBe(inflight < cap);
        if (!decision.admit) expect(decision.reason).toBe('inflight_cap');
      }),
    );
  });

  it('a dispatcher that releases only through the gate never exceeds the cap', () => {
    // Arbitrary interleavings of "try to release" and "a request completes".
    fc.assert(
      fc.property(
        fc.integer({ min: 1, max: 16 }),
        fc.array(fc.boolean(), { maxLength: 500 }),
        (cap, ops) => {
          let inflight = 0;
          for (const release of ops) {
            if (release) {
              if (gateDecision({ name: 'e', inflight, cap }).admit) inflight += 1;
            } else if (inflight > 0) inflight -= 1;
            expect(inflight).toBeLessThanOrEqual(cap);
          }
        },
      ),
    );
  });

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
});
