// Per-engine accounting of released work for the prefill rules.
import { afterEach, describe, expect, it, vi } from 'vitest';
import {
  emptyCounters,
  longPromptStats,
  PrefillRate,
  scraped,
  settlePending,
  trackRelease,
} from '../src/prefill-tracker.ts';

afterEach(() => vi.useRealTimers());

describe('prefill tracker', () => {
  it('counts a streaming long prompt in prefill until its first byte, and measures the rate there', () => {
    const c = emptyCounters();
    const rate = new PrefillRate();
    const changed = vi.fn();
    const work = trackRelease(c, {
      long: true,
      promptTokens: 65_536,
      stream: true,
      releasedAt: 0,
      rate,
      changed,
    });
    settlePending(c, 10_000);
    expect(c).toMatchObject({ longInflight: 1, longInPrefill: 1, kvPendingTokens: 65_536 });
    expect(work.remainingTokens(10_000)).toBe(65_536); // no rate measured yet
    work.firstByte(128_000, 200);
    expect(rate.value).toBe(512);
    settlePending(c, 128_000);
    expect(c).toMatchObject({ longInflight: 1, longInPrefill: 0, kvPendingTokens: 65_536 });
    expect(changed).toHaveBeenCalledTimes(1);
    // The next scrape shows the whole prompt in the engine's KV usage.
    scraped(c, 152_432);
    settlePending(c, 129_000);
    expect(c).toMatchObject({ kvPendingTokens: 0, kvCapacityTokens: 152_432 });
    work.finished();
    work.finished(); // once only
    expect(c).toMatchObject({ longInflight: 0, longInPrefill: 0 });
    expect(changed).toHaveBeenCalledTimes(2);
  });

  it("ends the prefill of a long prompt the engine refused, without taking the error's first byte as a rate", () => {
    const c = emptyCounters();
    const rate = new PrefillRate();
    rate.sample(65_536, 128); // 512 tokens per second, measured before
    const changed = vi.fn();
    const work = trackRelease(c, {
      long: true,
      promptTokens: 140_000,
      stream: true,
      releasedAt: 0,
      rate,
      changed,
    });
    // A 400 (prompt over max_model_len) comes at once: it read as 140,000 tokens in 5 ms.
    work.firstByte(5, 400);
    expect(rate.value).toBe(512);
    expect(c).toMatchObject({ longInflight: 1, longInPrefill: 0 });
    expect(work.inPrefill).toBe(false);
    expect(changed).toHaveBeenCalledTimes(1);
  });

  it('counts a short prompt as KV pending until the next scrape, never as a long prompt', () => {
    const c = emptyCounters();
    const work = trackRelease(c, {
      long: false,
      promptTokens: 300,
      stream: true,
      releasedAt: 0,
      rate: new PrefillRate(),
      changed: () => {},
    });
    settlePending(c, 0);
    expect(c).toMatchObject({ longInflight: 0, longInPrefill: 0, kvPendingTokens: 300 });
    expect(work.inPrefill).toBe(false);
    scraped(c, undefined);
    settlePending(c, 0);
    expect(c.kvPendingTokens).toBe(0);
    expect(c).not.toHaveProperty('kvCapacityTokens');
  });

  it('ends the prefill of a non-streaming long prompt at its estimated prefill time once a rate is known', () => {
    vi.useFakeTimers();
    const c = emptyCounters();
    const rate = new PrefillRate();
    rate.sample(1000, 2); // 500 tokens per second
    const changed = vi.fn();
    const work = trackRelease(c, {
      long: true,
      promptTokens: 10_000,
      stream: false,
      releasedAt: 0,
      rate,
      changed,
    });
    expect(work.remainingTokens(4_000)).toBe(8_000);
    // Of its prompt, only the part not prefilled yet is KV the gauges cannot show.
    settlePending(c, 4_000);
    expect(c.kvPendingTokens).toBe(8_000);
    vi.advanceTimersByTime(19_999);
    expect(c.longInPrefill).toBe(1);
    vi.advanceTimersByTime(1);
    expect(c.longInPrefill).toBe(0);
    expect(changed).toHaveBeenCalledTimes(1);
    // A non-streaming answer's end is no prefill measurement.
    expect(rate.value).toBe(500);
  });

  it('without a measured rate, a non-streaming long prompt stays in prefill until it completes', () => {
    vi.useFakeTimers();
    const c = emptyCounters();
    const work = trackRelease(c, {
      long: true,
      promptTokens: 10_000,
      stream: false,
      releasedAt: 0,
      rate: new PrefillRate(),
      changed: () => {},
    });
    vi.advanceTimersByTime(3_600_000);
    expect(c.longInPrefill).toBe(1);
    work.finished();
    expect(c.longInPrefill).toBe(0);
  });

  it("falls back on the engines' own rate until a streamed long prompt has been measured", () => {
    const rate = new PrefillRate(0.5);
    expect(rate.current).toBeUndefined();
    rate.sampleEngine(71_000, 252, false); // ~282 tokens per second from an older engine
    expect(rate.current).toBeCloseTo(281.7, 1);
    rate.sample(65_536, 128); // 512 measured on a stream through Sluice
    expect(rate.current).toBe(512);
    expect(rate.enginePromptValue).toBeCloseTo(281.7, 1);
  });

  it("prefers the engines' cache-free rate to their prompt-token rate", () => {
    const rate = new PrefillRate(0.5);
    // An older engine: 40 turns of a 64,000-token conversation, mostly prefix-cache hits,
    // beside a cold 65,536-token prompt, read as prompt tokens over prefill seconds.
    rate.sampleEngine(65_536 + 40 * 64_000, 254, false);
    expect(rate.current).toBeCloseTo(10_336.8, 1);
    // A vLLM >= 0.13 engine in the same pool, the same requests by their computed tokens.
    rate.sampleEngine(65_536 + 40 * 512, 254, true);
    expect(rate.current).toBeCloseTo(338.6, 1);
  });

  it("does not let a streamed prompt served from the prefix cache read faster than the engines' cache-free rate", () => {
    const rate = new PrefillRate();
    rate.sampleEngine(65_536, 250, true); // the engine computed 262 tokens a second
    // A 64,000-token turn of a conversation already in the prefix cache: first byte in 0.4 s.
    rate.sample(64_000, 0.4);
    expect(rate.value).toBe(160_000);
    expect(rate.current).toBeCloseTo(262.1, 1);
    // A cold prompt streamed slower than the engines' rate (queued behind others) is kept.
    const cold = new PrefillRate();
    cold.sampleEngine(65_536, 250, true);
    cold.sample(65_536, 400);
    expect(cold.current).toBeCloseTo(163.8, 1);
  });

  it('smooths the rate and ignores impossible samples', () => {
    const rate = new PrefillRate(0.5);
    rate.sample(1000, 0);
    rate.sample(-5, 1);
    expect(rate.value).toBeUndefined();
    rate.sample(1000, 1);
    rate.sample(3000, 1);
    expect(rate.value).toBe(2000);
  });

  it('publishes the held tokens and the prefill the released long prompts likely have left', () => {
    const c = emptyCounters();
    const rate = new PrefillRate();
    rate.sample(500, 1);
    const work = trackRelease(c, {
      long: true,
      promptTokens: 20_000,
      stream: true,
      releasedAt: 0,
      rate,
      changed: () => {},
    });
    expect(
      longPromptStats({
        held: { count: 2, tokens: 30_000 },
        released: [work],
        rate,
        parallelPrefills: 1,
        now: 10_000,
      }),
    ).toEqual({
      held: 2,
      heldTokens: 30_000,
      inPrefill: 1,
      prefillRemainingTokens: 15_000,
      prefillTokensPerSecond: 500,
      parallelPrefills: 1,
    });
  });
});
