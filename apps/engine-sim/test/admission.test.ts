// vLLM V1 admission rules, each driven step by step on the pure scheduler.
import { describe, expect, it } from 'vitest';
import { parseSimOptions } from '../src/options.ts';
import {
  Scheduler,
  Sequence,
  type SchedulerConfig,
  type SequenceListener,
} from '../src/scheduler.ts';

const quiet: SequenceListener = { onToken: () => {}, onFinish: () => {} };

const base: SchedulerConfig = {
  maxNumSeqs: 4,
  maxNumBatchedTokens: 64,
  numGpuBlocks: 64,
  blockSize: 4,
  stepOverheadSeconds: 0.01,
  prefillTokensPerSecond: 1000,
  decodeSecondsPerSequence: 0.001,
};

function seq(id: string, prompt: number, output: number, arrival = 0, priority = 0): Sequence {
  return new Sequence(id, prompt, output, 'length', arrival, quiet, { priority });
}

const chunks = (s: Scheduler, at = 0) =>
  s.schedule(at)!.work.map((w) => [w.seq.id, w.tokens] as const);

describe('--long-prefill-token-threshold (scheduler.py: "if 0 < threshold < num_new_tokens: num_new_tokens = threshold")', () => {
  it('caps a waiting request’s first chunk and a running request’s later chunks, leaving budget to others', () => {
    const s = new Scheduler({ ...base, longPrefillTokenThreshold: 16 });
    const a = seq('a', 100, 1);
    const b = seq('b', 10, 1);
    s.add(a);
    s.add(b);
    const first = s.schedule(0)!;
    expect(first.work.map((w) => [w.seq.id, w.tokens])).toEqual([
      ['a', 16], // waiting loop: capped at the threshold
      ['b', 10], // a short prompt under the threshold gets all of it
    ]);
    s.complete(first);
    expect(chunks(s, 1)).toEqual([['a', 16]]); // running loop: capped again
  });

  it('is off at 0 (vLLM default): a prompt takes the whole budget', () => {
    const s = new Scheduler(base);
    s.add(seq('a', 100, 1));
    expect(chunks(s)).toEqual([['a', 64]]);
  });

  it('is read from --long-prefill-token-threshold or VLLM_LONG_PREFILL_TOKEN_THRESHOLD, default 0', () => {
    expect(parseSimOptions([]).longPrefillTokenThreshold).toBe(0);
    expect(
      parseSimOptions(['--long-prefill-token-threshold', '512']).longPrefillTokenThreshold,
    ).toBe(512);
    expect(
      parseSimOptions([], { VLLM_LONG_PREFILL_TOKEN_THRESHOLD: '256' }).longPrefillTokenThreshold,
    ).toBe(256);
  });
});

describe('admission reserves the whole prompt (kv_cache_manager.py allocate_slots full_sequence_must_fit, scheduler_reserve_full_isl default True)', () => {
  // 16 blocks of 4 tokens. `hog` holds 12 blocks, leaving 4 (16 tokens).
  const setup = (config: Partial<SchedulerConfig>) => {
    const s = new Scheduler({ ...base, numGpuBlocks: 16, maxNumBatchedTokens: 48, ...config });
    const hog = seq('hog', 48, 100);
    s.add(hog);
    while (hog.generated === 0) s.complete(s.schedule(0)!);
    expect(s.freeBlocks).toBe(4);
    return s;
  };

  it('does not admit a request whose whole prompt does not fit, although its first chunk would', () => {
    const s = setup({ longPrefillTokenThreshold: 8 });
    const big = seq('big', 40, 1, 0.5); // 10 blocks; first chunk of 8 tokens = 2 blocks
    s.add(big);
    const step = s.schedule(1)!;
    expect(step.work.map((w) => w.seq.id)).toEqual(['hog']);
    expect(big.state).toBe('waiting');
    expect(big.blocks).toBe(0); // nothing allocated while waiting
  });

  it('allocates only the scheduled chunk once admitted', () => {
    const s = setup({ longPrefillTokenThreshold: 4 });
    const fits = seq('fits', 12, 1, 0.5); // 3 blocks fit in the 4 free
    s.add(fits);
    s.schedule(1);
    expect(fits.state).toBe('running');
    expect(fits.blocks).toBe(1); // the 4-token chunk, not the 3 blocks of the prompt
  });

  it('stops admission at a head that does not fit, even when a later request would (FCFS break)', () => {
    const s = setup({});
    const big = seq('big', 40, 1, 0.5);
    const small = seq('small', 4, 1, 0.6);
    s.add(big);
    s.add(small);
    s.schedule(1);
    expect(big.state).toBe('waiting');
    expect(small.state).toBe('waiting');
  });

  it('with --first-chunk-admission (vLLM V1 before PR #37307) admits on the first chunk and preempts later', () => {
    const s = setup({ longPrefillTokenThreshold: 8, reserveFullIsl: false });
    const big = seq('big', 40, 1, 0.5);
    s.add(big);
    s.schedule(1);
    expect(big.state).toBe('running');
    expect(big.blocks).toBe(2);
    expect(parseSimOptions(['--first-chunk-admission']).firstChunkAdmission).toBe(true);
    expect(parseSimOptions([]).firstChunkAdmission).toBe(false);
  });
});

describe('preemption in the running loop (scheduler.py allocate_slots retry loop)', () => {
  it('fcfs: "preempted_req = self.running.pop()" takes the last of running, which is recomputed from 0', () => {
    // 6 blocks of 4 tokens; three 8-token prompts decoding.
    const s = new Scheduler({ ...base, numGpuBlocks: 6 });
    const [a, b, c] = [seq('a', 8, 20), seq('b', 7, 20, 0.1), seq('c', 4, 20, 0.2)];
    for (const q of [a, b, c]) s.add(q);
    let t = 0;
    while (s.preemptions === 0) s.complete(s.schedule(t++)!);
    expect(c.state).toBe('waiting');
    expect(c.computed).toBe(0);
    expect(s.waiting[0]).toBe(c); // "self.waiting.prepend_request(request)"
    expect([a.state, b.state]).toEqual(['running', 'running']);
  });

  it('priority: the victim is "max(self.running, key=lambda r: (r.priority, r.arrival_time))", not the newest', () => {
    const s = new Scheduler({ ...base, numGpuBlocks: 6, policy: 'priority' });
    const a = seq('a', 8, 20, 0, 0);
    const low = seq('low', 7, 20, 0.1, 5); // lowest priority (largest value)
    const c = seq('c', 4, 20, 0.2, 1); // newest
    for (const q of [a, low, c]) s.add(q);
    let t = 0;
    while (s.preemptions === 0) s.complete(s.schedule(t++)!);
    expect(low.state).toBe('waiting');
    expect(c.state).toBe('running');
  });

  it('admits no waiting request in a step that preempted ("if not preempted_reqs")', () => {
    const s = new Scheduler({ ...base, numGpuBlocks: 6 });
    const [a, b] = [seq('a', 8, 20), seq('b', 8, 20)];
    s.add(a);
    s.add(b);
    let t = 0;
    let step;
    do {
      step = s.schedule(t++)!;
      s.complete(step);
    } while (s.preemptions === 0);
    expect(step.work.map((w) => w.seq.id)).toEqual(['a']);
    expect(b.state).toBe('waiting');
  });
});
