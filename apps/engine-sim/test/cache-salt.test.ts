// vLLM's `cache_salt`: read and checked as vLLM's request models do, and mixed into the first
// block's hash (kv_cache_utils.py `generate_block_hash_extra_keys`), so that only requests with
// the same salt share cached blocks.
import { describe, expect, it } from 'vitest';
import { parseSimRequest, SimRequestError } from '../src/openai-request.ts';
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
const document = 'A confidential quarterly report, paragraph after paragraph. '.repeat(4);

function sequence(id: string, salt: string | undefined, arrival: number): Sequence {
  const tokens = Math.ceil(document.length / 4);
  return new Sequence(id, tokens, 2, 'length', arrival, quiet, {
    blockHashes: promptBlockHashes(document, tokens, config.blockSize, salt),
  });
}

function run(s: Scheduler, t0: number): void {
  let t = t0;
  for (;;) {
    const start = s.nextStart(t);
    if (start === undefined) return;
    const step = s.schedule(start)!;
    s.complete(step);
    t = step.start + step.duration;
  }
}

describe('promptBlockHashes with a cache_salt', () => {
  const tokens = 40;
  const plain = promptBlockHashes(document, tokens, 4);

  it('changes every block hash (the first directly, the rest through the chain)', () => {
    const salted = promptBlockHashes(document, tokens, 4, 'salt-a');
    expect(salted).toHaveLength(plain.length);
    salted.forEach((h, i) => expect(h).not.toBe(plain[i]));
  });

  it('is deterministic per salt and differs between salts', () => {
    const a = promptBlockHashes(document, tokens, 4, 'salt-a');
    expect(promptBlockHashes(document, tokens, 4, 'salt-a')).toStrictEqual(a);
    const b = promptBlockHashes(document, tokens, 4, 'salt-b');
    b.forEach((h, i) => expect(h).not.toBe(a[i]));
    // A salt is not confused with a longer one that begins with it.
    expect(promptBlockHashes(document, tokens, 4, 'salt-a1')[0]).not.toBe(a[0]);
  });

  it('keeps the unsalted hashes as they were (an empty salt is none, as in vLLM)', () => {
    expect(promptBlockHashes(document, tokens, 4, undefined)).toStrictEqual(plain);
    expect(promptBlockHashes(document, tokens, 4, '')).toStrictEqual(plain);
  });

  it('still shares the leading blocks of a common prefix under the same salt', () => {
    const longer = promptBlockHashes(`${document} and more`, tokens + 8, 4, 'salt-a');
    expect(longer.slice(0, plain.length)).toStrictEqual(
      promptBlockHashes(document, tokens, 4, 'salt-a'),
    );
  });
});

describe('the prefix cache with salts', () => {
  it('serves a cached prompt only to requests with the same salt', () => {
    const s = new Scheduler(config);
    const alpha = sequence('alpha', 'alpha-salt', 0);
    s.add(alpha);
    run(s, 0);
    const beta = sequence('beta', 'beta-salt', 10);
    s.add(beta);
    run(s, 10);
    const unsalted = sequence('anonymous', undefined, 20);
    s.add(unsalted);
    run(s, 20);
    const alphaAgain = sequence('alpha-again', 'alpha-salt', 30);
    s.add(alphaAgain);
    run(s, 30);
    expect(alpha.cachedTokens).toBe(0);
    expect(beta.cachedTokens).toBe(0);
    expect(unsalted.cachedTokens).toBe(0);
    expect(alphaAgain.cachedTokens).toBeGreaterThan(0);
    expect(alphaAgain.cachedTokens).toBe(alphaAgain.promptTokens - 4); // all but the last block
    expect(s.prefixCacheHits).toBe(alphaAgain.cachedTokens);
  });
});

describe('cache_salt in a request', () => {
  const parse = (endpoint: 'chat' | 'completion', extra: Record<string, unknown>) =>
    parseSimRequest(
      endpoint,
      endpoint === 'chat'
        ? { model: 'm', messages: [{ role: 'user', content: 'hi' }], ...extra }
        : { model: 'm', prompt: 'hi', ...extra },
      'm',
      1000,
    );

  it('is read on both completion endpoints; absent or null is none', () => {
    for (const endpoint of ['chat', 'completion'] as const) {
      expect(parse(endpoint, { cache_salt: 's1' }).cacheSalt).toBe('s1');
      expect(parse(endpoint, {}).cacheSalt).toBeUndefined();
      expect(parse(endpoint, { cache_salt: null }).cacheSalt).toBeUndefined();
    }
  });

  it('takes the last of duplicate keys, as JSON.parse and Python json read a body', () => {
    const body = JSON.parse(
      '{"model":"m","prompt":"hi","cache_salt":"client","cache_salt":"tenant"}',
    );
    expect(parseSimRequest('completion', body, 'm', 1000).cacheSalt).toBe('tenant');
  });

  it.each([[''], [7], [true], [['a']], [{ salt: 'a' }]])('refuses %j as vLLM does', (cacheSalt) => {
    for (const endpoint of ['chat', 'completion'] as const) {
      let err: unknown;
      try {
        parse(endpoint, { cache_salt: cacheSalt });
      } catch (e) {
        err = e;
      }
      expect(err).toBeInstanceOf(SimRequestError);
      expect((err as SimRequestError).status).toBe(400);
      expect((err as SimRequestError).message).toBe(
        "Parameter 'cache_salt' must be a non-empty string if provided.",
      );
      expect((err as SimRequestError).param).toBe('cache_salt');
    }
  });

  it('does not change the answer: the output seed is the same with and without it', () => {
    expect(parse('chat', { cache_salt: 'a' }).seed).toBe(parse('chat', {}).seed);
  });
});
