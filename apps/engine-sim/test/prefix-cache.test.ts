// Prefix caching (vLLM V1 default on) and metrics at vLLM's times, on the pure scheduler.
import { describe, expect, it } from 'vitest';
import { EngineStats } from '../src/engine.ts';
import { parseSimOptions } from '../src/options.ts';
import { promptBlockHashes } from '../src/prefix-hash.ts';
import {
  Scheduler,
  Sequence,
  type SchedulerConfig,
  type SequenceListener,
} from '../src/scheduler.ts';

const quiet: SequenceListener = { onToken: () => {}, onFinish: () => {} };
const config: SchedulerConfig = {
  maxNumSeqs: 4,
  maxNumBatchedTokens: 256,
  numGpuBlocks: 64,
  blockSize: 4,
  stepOverheadSeconds: 0,
  prefillTokensPerSecond: 1000,
  decodeSecondsPerSequence: 0.001,
  enablePrefixCaching: true,
};
const system = 'You are a careful assistant. '.repeat(12); // 348 characters = 87 tokens

function chat(id: string, user: string, arrival = 0): Sequence {
  const text = JSON.stringify([
    { role: 'system', content: system },
    { role: 'user', content: user },
  ]);
  const tokens = Math.ceil(text.length / 4);
  return new Sequence(id, tokens, 2, 'length', arrival, quiet, {
    blockHashes: promptBlockHashes(text, tokens, config.blockSize),
  });
}

/** Runs to completion; returns the prompt tokens actually computed per sequence. */
function run(s: Scheduler, t0 = 0): number {
  let t = t0;
  for (;;) {
    const start = s.nextStart(t);
    if (start === undefined) return t;
    const step = s.schedule(start)!;
    s.complete(step);
    t = step.start + step.duration;
  }
}

describe('prefix caching (kv_cache_manager.py get_computed_blocks, block_pool.py)', () => {
  it('the same long system prompt sent twice costs less prefill the second time', () => {
    const s = new Scheduler(config);
    const first = chat('a', 'What is a sluice?');
    s.add(first);
    run(s);
    const second = chat('b', 'And a weir?', 10);
    s.add(second);
    run(s, 10);
    expect(first.prefilledTokens).toBe(first.promptTokens);
    expect(second.cachedTokens).toBeGreaterThanOrEqual(80); // the system prompt's full blocks
    expect(second.prefilledTokens).toBe(second.promptTokens - second.cachedTokens);
    expect(second.firstTokenAt! - second.scheduledAt!).toBeLessThan(
      first.firstTokenAt! - first.scheduledAt!,
    );
    // vllm:prefix_cache_queries counts queried tokens, _hits the cached ones.
    expect(s.prefixCacheQueries).toBe(first.promptTokens + second.promptTokens);
    expect(s.prefixCacheHits).toBe(second.cachedTokens);
  });

  it('never skips the last prompt token: an identical prompt recomputes at least one ("max_cache_hit_length = request.num_tokens - 1")', () => {
    const s = new Scheduler(config);
    s.add(chat('a', 'same'));
    run(s);
    const again = chat('b', 'same', 10);
    s.add(again);
    run(s, 10);
    expect(again.cachedTokens).toBeLessThan(again.promptTokens);
    expect(again.prefilledTokens).toBeGreaterThanOrEqual(1);
    expect(again.cachedTokens % config.blockSize).toBe(0);
  });

  it('counts cached free blocks as free in KV usage ("1.0 - get_num_free_blocks() / total")', () => {
    const s = new Scheduler(config);
    s.add(chat('a', 'x'));
    run(s);
    expect(s.kv.numCached).toBeGreaterThan(0);
    expect(s.kvUsage).toBe(0);
  });

  it('evicts the least recently freed cached blocks first when the pool runs out (LRU free queue)', () => {
    const s = new Scheduler({ ...config, numGpuBlocks: 40 });
    const old = chat('old', 'first');
    s.add(old);
    run(s);
    // An unrelated prompt needing almost the whole pool takes the old cached blocks.
    const filler = new Sequence('f', 150, 2, 'length', 10, quiet, {
      blockHashes: promptBlockHashes('z'.repeat(600), 150, 4),
    });
    s.add(filler);
    run(s, 10);
    const again = chat('again', 'first', 20);
    s.add(again);
    run(s, 20);
    expect(again.cachedTokens).toBeLessThan(old.promptTokens - 4);
  });

  it('a preempted request resumes from its cached prompt blocks', () => {
    // 30 blocks of 4: two 60-token prompts growing by 20 tokens each do not both fit.
    const s = new Scheduler({ ...config, numGpuBlocks: 34, maxNumBatchedTokens: 256 });
    const mk = (id: string, arrival: number) =>
      new Sequence(id, 60, 20, 'length', arrival, quiet, {
        blockHashes: promptBlockHashes(id.repeat(240), 60, 4),
      });
    const [a, b] = [mk('a', 0), mk('b', 0)];
    s.add(a);
    s.add(b);
    run(s);
    expect(b.preemptions).toBeGreaterThan(0);
    // Recomputed on resume: only what the cache no longer held.
    expect(b.prefilledTokens).toBeLessThan(2 * 60 + 20);
  });

  it('is on by default; --no-enable-prefix-caching turns it off', () => {
    expect(parseSimOptions([]).enablePrefixCaching).toBe(true);
    expect(parseSimOptions(['--no-enable-prefix-caching']).enablePrefixCaching).toBe(false);
  });
});

describe('request metrics at vLLM’s times (stats.py update_from_finished_request)', () => {
  it('observes queue, prefill, decode, inference and e2e time when the request finishes, not at its first token', () => {
    const stats = new EngineStats();
    const q = new Sequence('r', 10, 3, 'length', 1, quiet);
    q.scheduledAt = 3;
    q.generated = 1;
    stats.observeToken(q, 5);
    q.lastTokenAt = 5;
    expect(stats.ttft.count).toBe(1);
    expect(stats.queueTime.count).toBe(0);
    expect(stats.prefillTime.count).toBe(0);
    q.firstTokenAt = 5;
    q.generated = 2;
    stats.observeToken(q, 5.5); // inter-token latency 0.5
    expect(stats.interTokenLatency.sum).toBeCloseTo(0.5);
    stats.observeFinish(q, 6);
    expect([
      stats.queueTime.sum,
      stats.prefillTime.sum,
      stats.decodeTime.sum,
      stats.inferenceTime.sum,
      stats.e2eLatency.sum,
    ]).toEqual([2, 2, 1, 3, 5]);
  });

  it('observes prompt + generated tokens per step in vllm:iteration_tokens_total', () => {
    const stats = new EngineStats();
    stats.observeStep(100, 1);
    expect(stats.iterationTokens.count).toBe(1);
    expect(stats.iterationTokens.sum).toBe(101);
  });
});
