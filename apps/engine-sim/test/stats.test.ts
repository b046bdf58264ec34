// The request histograms vLLM observes when a request finishes.
import { describe, expect, it } from 'vitest';
import { EngineStats, oneTwoFiveBuckets } from '../src/engine.ts';
import { Sequence } from '../src/sequence.ts';

describe('engine stats', () => {
  it("buckets prompt lengths 1-2-5 up to max_model_len, as vLLM's build_1_2_5_buckets", () => {
    expect(oneTwoFiveBuckets(100)).toEqual([1, 2, 5, 10, 20, 50, 100]);
    expect(oneTwoFiveBuckets(131_072).at(-1)).toBe(100_000);
  });

  it("observes a finished request's prompt tokens in vllm:request_prompt_tokens", () => {
    const stats = new EngineStats(131_072);
    const listener = { onToken() {}, onFinish() {} };
    const seq = new Sequence('r', 65_536, 4, 'length', 0, listener);
    seq.scheduledAt = 1;
    seq.firstTokenAt = 126;
    stats.observeFinish(seq, 130);
    expect(stats.requestPromptTokens.count).toBe(1);
    expect(stats.requestPromptTokens.sum).toBe(65_536);
    expect(stats.prefillTime.sum).toBe(125);
  });
});
