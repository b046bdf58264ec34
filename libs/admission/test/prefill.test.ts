// Worked examples of the prefill rules: one per rule, on the reference engine (cap 4,
// 152,432 KV tokens) unless said otherwise.
import { describe, expect, it } from 'vitest';
import type { GatePolicy } from '../src/gate.ts';
import {
  classify,
  freeKvTokens,
  isAged,
  longSlots,
  longWaitSeconds,
  pickEngineFor,
  releaseDecision,
  shortsMayPass,
  type LongPromptPolicy,
  type PrefillView,
} from '../src/prefill.ts';

const NOW = 1_000_000;
const gate: GatePolicy = { kvThreshold: 0.9, failMode: 'open', maxGaugeAgeMs: 2000 };
const policy: LongPromptPolicy = {
  thresholdTokens: 8192,
  maxShare: 0.5,
  maxInPrefill: 1,
  agingSeconds: 60,
  kvFit: true,
};

function engine(over: Partial<PrefillView> = {}): PrefillView {
  return {
    name: 'e',
    inflight: 0,
    cap: 4,
    health: 'healthy',
    gauges: { running: 0, waiting: 0, kvUsage: 0, at: NOW, inflightAtScrape: 0 },
    lane: 'any',
    longInflight: 0,
    longInPrefill: 0,
    kvCapacityTokens: 152_432,
    kvPendingTokens: 0,
    ...over,
  };
}

const decide = (e: PrefillView, tokens: number, p = policy, g = gate) =>
  releaseDecision(e, classify(tokens, p), tokens, p, g, NOW);

describe('prefill rules', () => {
  it('calls a prompt long only above the threshold', () => {
    expect(classify(8192, policy)).toBe('short');
    expect(classify(8193, policy)).toBe('long');
    expect(classify(0, policy)).toBe('short');
  });

  it('gives long prompts half of the slots, rounded down, at least one; a long lane all of them', () => {
    expect(longSlots(engine(), policy)).toBe(2);
    expect(longSlots(engine({ cap: 3 }), policy)).toBe(1);
    expect(longSlots(engine({ cap: 1 }), policy)).toBe(1);
    expect(longSlots(engine({ lane: 'long' }), policy)).toBe(4);
  });

  it('holds a long prompt once its share of slots is taken, while short ones still go', () => {
    const e = engine({ inflight: 2, longInflight: 2 });
    expect(decide(e, 65_536)).toEqual({ admit: false, reason: 'long_share' });
    expect(decide(e, 100)).toEqual({ admit: true });
  });

  it('lets one long prompt prefill at a time per engine', () => {
    const e = engine({ inflight: 1, longInflight: 1, longInPrefill: 1 });
    expect(decide(e, 16_384)).toEqual({ admit: false, reason: 'long_prefill' });
    expect(decide(e, 16_384, { ...policy, maxInPrefill: 2 })).toEqual({ admit: true });
    // Once the first long prompt decodes, the next may start its prefill.
    expect(decide(engine({ inflight: 1, longInflight: 1 }), 16_384)).toEqual({ admit: true });
  });

  it('holds a long prompt that does not fit the free KV tokens, counting what the gauges cannot show yet', () => {
    // 60% used: 60,972 tokens free.
    const e = engine({
      gauges: { running: 1, waiting: 0, kvUsage: 0.6, at: NOW, inflightAtScrape: 1 },
      inflight: 1,
    });
    expect(freeKvTokens(e, gate, NOW)).toBeCloseTo(60_972.8);
    expect(decide(e, 65_536)).toEqual({ admit: false, reason: 'kv_fit' });
    expect(decide(e, 16_384)).toEqual({ admit: true });
    expect(decide({ ...e, kvPendingTokens: 50_000 }, 16_384)).toEqual({
      admit: false,
      reason: 'kv_fit',
    });
    expect(decide(e, 65_536, { ...policy, kvFit: false })).toEqual({ admit: true });
  });

  it('lets a long prompt be the probe of frozen gauges: their KV usage is not what is left', () => {
    // 95% used at the scrape, unchanged for 10 s with nothing of ours in flight: frozen.
    const frozen = engine({
      gauges: {
        running: 4,
        waiting: 0,
        kvUsage: 0.95,
        at: NOW,
        inflightAtScrape: 0,
        unchangedSince: NOW - 10_000,
      },
    });
    const probing = { ...gate, frozenAfterMs: 10_000 };
    expect(decide(frozen, 65_536, policy, probing)).toEqual({ admit: true });
    expect(freeKvTokens(frozen, probing, NOW)).toBe(152_432);
    // A moment short of the threshold, the same reading holds it.
    const recent = { ...probing, frozenAfterMs: 10_001 };
    expect(decide(frozen, 65_536, policy, recent)).toEqual({
      admit: false,
      reason: 'engine_busy',
    });
  });

  it('never holds on KV a prompt larger than the whole KV cache: vLLM refuses it at once', () => {
    // 60% used; the capacity (152,432 tokens) is less than the prompt's estimate.
    const e = engine({
      gauges: { running: 1, waiting: 0, kvUsage: 0.6, at: NOW, inflightAtScrape: 1 },
      inflight: 1,
    });
    expect(decide(e, 250_000)).toEqual({ admit: true });
    // The long prompts' own rules still apply to it.
    expect(decide({ ...e, longInflight: 1, longInPrefill: 1 }, 250_000)).toEqual({
      admit: false,
      reason: 'long_prefill',
    });
    // Held, it would be past its aging limit and hold every short prompt behind it.
    expect(shortsMayPass(true, 'kv_fit')).toBe(false);
  });

  it('with unknown KV (no capacity exported, or stale gauges) holds on KV only in fail mode closed', () => {
    const unknown = engine({ kvCapacityTokens: undefined });
    expect(decide(unknown, 65_536)).toEqual({ admit: true });
    const stale = engine({ health: 'stale' });
    expect(decide(stale, 65_536)).toEqual({ admit: true });
    expect(decide(unknown, 65_536, policy, { ...gate, failMode: 'closed' })).toEqual({
      admit: false,
      reason: 'kv_fit',
    });
  });

  it('says what would still hold a long prompt if short ones left room: its own rules before the plain gate', () => {
    const full = engine({ inflight: 4, longInflight: 2, longInPrefill: 1 });
    expect(decide(full, 65_536)).toEqual({ admit: false, reason: 'long_share' });
    expect(decide(full, 10)).toEqual({ admit: false, reason: 'inflight_cap' });
    // Only room holds it: the plain gate's reason.
    expect(decide(engine({ inflight: 4, longInflight: 1 }), 65_536)).toEqual({
      admit: false,
      reason: 'inflight_cap',
    });
  });

  it('honours lanes: a short lane takes no long prompt, a long lane no short one', () => {
    expect(decide(engine({ lane: 'short' }), 65_536)).toEqual({ admit: false, reason: 'lane' });
    expect(decide(engine({ lane: 'long' }), 100)).toEqual({ admit: false, reason: 'lane' });
    expect(decide(engine({ lane: 'long' }), 65_536)).toEqual({ admit: true });
  });

  it('sends a long prompt where the fewest long prompts run, then the most KV is free', () => {
    const engines = [
      engine({ name: 'a', inflight: 1, longInflight: 1 }),
      engine({
        name: 'b',
        inflight: 2,
        gauges: { running: 2, waiting: 0, kvUsage: 0.5, at: NOW, inflightAtScrape: 2 },
      }),
      engine({
        name: 'c',
        inflight: 0,
        gauges: { running: 0, waiting: 0, kvUsage: 0.1, at: NOW, inflightAtScrape: 0 },
      }),
    ];
    expect(pickEngineFor(engines, 'long', 20_000, policy, gate, NOW)).toEqual({
      admit: true,
      index: 2,
    });
    // Short prompts go where the most slots are free.
    expect(pickEngineFor(engines, 'short', 100, policy, gate, NOW)).toEqual({
      admit: true,
      index: 2,
    });
  });

  it('reports the reason of the engine that came closest when none takes the prompt: room before the long-prompt rules', () => {
    const engines = [
      engine({ name: 'a', lane: 'short' }),
      engine({ name: 'b', inflight: 1, longInflight: 1, longInPrefill: 1 }),
      engine({ name: 'c', inflight: 4 }),
    ];
    expect(pickEngineFor(engines, 'long', 20_000, policy, gate, NOW)).toEqual({
      admit: false,
      reason: 'inflight_cap',
    });
    expect(pickEngineFor(engines.slice(0, 2), 'long', 20_000, policy, gate, NOW)).toEqual({
      admit: false,
      reason: 'long_prefill',
    });
    expect(pickEngineFor([engine({ lane: 'short' })], 'long', 9000, policy, gate, NOW)).toEqual({
      admit: false,
      reason: 'lane',
    });
  });

  it('ages a long prompt after agingSeconds', () => {
    expect(isAged(NOW - 59_999, policy, NOW)).toBe(false);
    expect(isAged(NOW - 60_000, policy, NOW)).toBe(true);
    expect(isAged(NOW, { ...policy, agingSeconds: 0 }, NOW)).toBe(true);
  });

  it('lets short prompts pass an aged long one only while what holds it is theirs to leave alone', () => {
    expect(shortsMayPass(false, 'inflight_cap')).toBe(true);
    expect(shortsMayPass(true, 'long_prefill')).toBe(true);
    expect(shortsMayPass(true, 'long_share')).toBe(true);
    expect(shortsMayPass(true, 'inflight_cap')).toBe(false);
    expect(shortsMayPass(true, 'kv_fit')).toBe(false);
    expect(shortsMayPass(true, 'kv_pressure')).toBe(false);
    expect(shortsMayPass(true, 'engine_busy')).toBe(false);
  });

  it("estimates a new long prompt's wait from the tokens ahead and the measured rate", () => {
    expect(
      longWaitSeconds({ tokensAhead: 131_072, prefillTokensPerSecond: 512, parallelPrefills: 1 }),
    ).toBe(256);
    expect(
      longWaitSeconds({ tokensAhead: 1000, prefillTokensPerSecond: 500, parallelPrefills: 2 }),
    ).toBe(1);
    expect(
      longWaitSeconds({
        tokensAhead: 1000,
        prefillTokensPerSecond: undefined,
        parallelPrefills: 1,
      }),
    ).toBeUndefined();
    expect(
      longWaitSeconds({ tokensAhead: -5, prefillTokensPerSecond: 100, parallelPrefills: 1 }),
    ).toBe(0);
  });
});
