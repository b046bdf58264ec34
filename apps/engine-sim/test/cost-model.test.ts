// Prefill cost grows with the context position (causal attention reads every earlier token).
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { prefillSeconds, type CostConfig } from '../src/cost-model.ts';
import { profiles } from '../src/profiles.ts';
import { Scheduler, Sequence, type SequenceListener } from '../src/scheduler.ts';

const quiet: SequenceListener = { onToken: () => {}, onFinish: () => {} };

/** Seconds from arrival to the first token of one uncached prompt alone on the homelab engine. */
function prefillAlone(tokens: number): number {
  const s = new Scheduler(profiles.homelab);
  const q = new Sequence('p', tokens, 1, 'length', 0, quiet);
  s.add(q);
  let t = 0;
  while (q.firstTokenAt === undefined) {
    const step = s.schedule(t)!;
    s.complete(step);
    t = step.start + step.duration;
  }
  return q.firstTokenAt;
}

describe('prefill cost model', () => {
  const c: CostConfig = {
    stepOverheadSeconds: 0,
    prefillTokensPerSecond: 500,
    prefillContextCost: 1e-7,
    decodeSecondsPerSequence: 0,
  };

  it('a chunk late in the context costs more than the same chunk at the start', () => {
    expect(prefillSeconds(c, 60000, 2048)).toBeGreaterThan(3 * prefillSeconds(c, 0, 2048));
  });

  it('the whole prompt costs L / R + c L^2 / 2 however it is chunked', () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 1, max: 100000 }),
        fc.integer({ min: 1, max: 8192 }),
        (length, chunk) => {
          let total = 0;
          for (let s = 0; s < length; s += chunk)
            total += prefillSeconds(c, s, Math.min(chunk, length - s));
          const whole = length / 500 + (1e-7 * length * length) / 2;
          expect(total).toBeCloseTo(whole, 6);
        },
      ),
    );
  });

  it('homelab: a 65k uncached prompt averages within the reference’s 262-525 tok/s (~250 s), short prompts near the top', () => {
    const rate = (tokens: number) => tokens / prefillAlone(tokens);
    const long = prefillAlone(65536);
    expect(long).toBeGreaterThan(240);
    expect(long).toBeLessThan(260);
    expect(rate(65536)).toBeGreaterThanOrEqual(255);
    expect(rate(65536)).toBeLessThanOrEqual(270);
    expect(rate(2048)).toBeGreaterThan(500);
    expect(rate(2048)).toBeLessThanOrEqual(525);
    expect(rate(8192)).toBeGreaterThan(rate(16384));
    expect(rate(16384)).toBeGreaterThan(rate(65536));
    // The documented table (README, profiles.ts).
    expect([2048, 8192, 16384, 65536].map((n) => Math.round(rate(n)))).toEqual([
      505, 464, 418, 262,
    ]);
  });
});
