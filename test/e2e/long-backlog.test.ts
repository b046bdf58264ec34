// Honest waiting: once the leader has measured how fast long prompts prefill, a new long
// prompt whose wait behind the long prompts ahead would exceed the park limit is refused at
// once (503 long_backlog, Retry-After) instead of being held for the whole limit first.
// A short prompt is still queued: it passes the long ones.
import { decodePoolStats, keySpace } from '@sluice/protocol';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { eventually, startStack, type Stack } from '../support/index.ts';

let stack: Stack;
let client: Redis;

beforeAll(async () => {
  // Long prompts above 1,000 tokens, prefilled at 1,000 tokens per second: 3 s for the one
  // that measures the rate, a minute for the one the test then waits behind.
  stack = await startStack({
    // vLLM's recommended chunk cap, so that a short prompt decodes beside the long prefill.
    sim: ['--prefill-tokens-per-second', '1000', '--long-prefill-token-threshold', '512'],
    env: {
      ADMISSION_MAX_INFLIGHT: '4',
      ADMISSION_MAX_PARK_SECONDS: '2',
      ADMISSION_LONG_PROMPT_TOKENS: '1000',
      ENGINE_SCRAPE_INTERVAL_MS: '100',
    },
  });
  client = new Redis(stack.redis.url);
});

afterAll(async () => {
  await client?.quit();
  await stack?.stop();
});

function chat(content: string, stream = true, signal?: AbortSignal) {
  return fetch(`${stack.gateway.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({
      model: 'm',
      messages: [{ role: 'user', content }],
      max_tokens: 4,
      stream,
    }),
    ...(signal ? { signal } : {}),
  });
}

/** A prompt the gateway estimates at `tokens` tokens (4 characters each). */
const long = (tag: string, tokens = 3000) => `${tag} ${'abcd'.repeat(tokens)}`.slice(0, tokens * 4);

async function stats() {
  const text = await client.get(keySpace('sluice').poolStats('default'));
  return text ? decodePoolStats(text) : undefined;
}

describe('honest waiting for long prompts', () => {
  it('refuses a long prompt at once when the long prompts ahead need more prefill than the park limit', async () => {
    // One long prompt all the way through: the leader measures the prefill rate on it.
    expect((await (await chat(long('measure'))).text()).endsWith('data: [DONE]\n\n')).toBe(true);
    await eventually(
      async () => ((await stats())?.longs?.prefillTokensPerSecond ?? 0) > 0 || undefined,
      'a measured prefill rate',
    );

    // A long prompt with a minute of prefill ahead: far past the 2 s park limit for as long
    // as the test runs.
    const abort = new AbortController();
    const ahead = chat(long('ahead', 60_000), true, abort.signal);
    await eventually(async () => {
      const longs = (await stats())?.longs;
      return longs && longs.inPrefill === 1 ? true : undefined;
    }, 'the long prompt in prefill');
    const refused = await eventually(async () => {
      // The gateway reads the leader's stats at most once a second: ask until it has.
      const res = await chat(long('refused'), false);
      return res.headers.get('x-sluice-reject-reason') === 'long_backlog' ? res : undefined;
    }, 'a long_backlog refusal');
    expect(refused.status).toBe(503);
    expect(Number(refused.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);
    const body = (await refused.json()) as { error: { code: string; message: string } };
    expect(body.error.code).toBe('long_backlog');
    expect(body.error.message).toMatch(/long prompts ahead need about \d+ s of prefill/);

    // A short prompt is not refused for the long backlog: it passes.
    const short = await chat('a short question');
    expect(short.status).toBe(200);
    expect((await short.text()).endsWith('data: [DONE]\n\n')).toBe(true);
    abort.abort();
    await ahead.catch(() => undefined);
  });
});
