// Tenants do not share the engine's prefix cache. With tenants, the gateway sets each completion
// request's vLLM `cache_salt` to its tenant's own (replacing the client's), and the engine
// (the simulator, as vLLM) shares cached blocks only between requests with the same salt: a
// prompt alpha sent is a cache hit for alpha's repeat but not for beta's identical guess, so
// beta cannot confirm alpha's prompt by timing. With SLUICE_TENANT_CACHE_SALT=off the bodies go
// on as sent and beta's copy hits alpha's blocks again. Cache hits are read from the engine's
// own `vllm:prefix_cache_hits` counter (cached prompt tokens), never from timings.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  answer,
  metricSum,
  startGateway,
  startStack,
  tenantPoolYaml,
  untilReady,
  type SluiceProcess,
  type Stack,
  type TestEngineSim,
} from '../support/index.ts';

const ALPHA_KEY = 'sk-alpha-cache-9a41e7-0123456789';
const BETA_KEY = 'sk-beta-cache-02d6bf-0123456789a';

let stack: Stack;
let sim: TestEngineSim;
/** SLUICE_TENANT_CACHE_SALT unset: on, the default. */
let salted: SluiceProcess;
/** SLUICE_TENANT_CACHE_SALT=off. */
let unsalted: SluiceProcess;

beforeAll(async () => {
  stack = await startStack({
    config: ({ url }) =>
      tenantPoolYaml({
        tenants: { alpha: ALPHA_KEY, beta: BETA_KEY },
        engineUrl: url,
        maxInflight: 4,
        queueDepth: 8,
      }),
  });
  ({ sim, gateway: salted } = stack);
  unsalted = await startGateway({ ...stack.env, SLUICE_TENANT_CACHE_SALT: 'off' });
  await Promise.all([untilReady(salted), untilReady(unsalted)]);
}, 90_000);

afterAll(async () => {
  await unsalted?.stop();
  await stack?.stop();
});

/**
 * A long private document of 2,090 prompt tokens (the reviewer's), 130 full blocks of 16. Its
 * tag comes first, so documents with different tags share no block even unsalted.
 */
const documentOf = (tag: string) => {
  const text = Array.from(
    { length: 160 },
    (_, i) => `${tag} ledger line ${i}: account ${(i * 7919) % 1000} holds ${i * 13} units. `,
  ).join('');
  expect(text.length).toBeGreaterThan(8360);
  return text.slice(0, 8360);
};

/** Prompt tokens the engine found cached, summed over every request it has taken. */
async function cachedTokens(): Promise<number> {
  return (await metricSum(sim.url, 'vllm:prefix_cache_hits_total')) ?? 0;
}

/**
 * Sends `document` as `key`'s tenant through `gateway` (the client's own cache_salt in
 * `extra`, if any) and returns the prompt tokens the engine found in its prefix cache for it.
 * One request at a time, each answered whole: the engine counts a request's hits when it is
 * first scheduled, before it answers.
 */
async function send(
  gateway: SluiceProcess,
  key: string,
  document: string,
  extra: Record<string, unknown> = {},
): Promise<number> {
  const before = await cachedTokens();
  const res = await answer(
    fetch(`${gateway.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${key}` },
      body: JSON.stringify({
        model: 'm',
        messages: [{ role: 'user', content: `${document}\n\nSummarise the document.` }],
        max_tokens: 4,
        ignore_eos: true,
        ...extra,
      }),
    }),
  );
  expect(res.status, res.body).toBe(200);
  return (await cachedTokens()) - before;
}

describe('tenant prefix-cache isolation (cache_salt)', () => {
  it("gives beta no cached tokens of alpha's prompt, while alpha's own repeat hits", async () => {
    const document = documentOf('alpha-private');
    expect(await send(salted, ALPHA_KEY, document)).toBe(0);
    // The same prompt from another tenant: computed from scratch, nothing to time.
    expect(await send(salted, BETA_KEY, document)).toBe(0);
    // A client naming a salt of its choosing gets its tenant's all the same.
    expect(await send(salted, BETA_KEY, document, { cache_salt: 'anything' })).toBeGreaterThan(0);
    expect(await send(salted, ALPHA_KEY, document, { cache_salt: 'anything' })).toBeGreaterThan(
      1000,
    );
    // alpha's repeat: everything but the last block comes from the cache.
    expect(await send(salted, ALPHA_KEY, document)).toBeGreaterThan(1000);
  });

  it('shares the cache between tenants again with SLUICE_TENANT_CACHE_SALT=off', async () => {
    const document = documentOf('shared-system-prompt');
    expect(await send(unsalted, ALPHA_KEY, document)).toBe(0);
    expect(await send(unsalted, BETA_KEY, document)).toBeGreaterThan(1000);
  });
});
