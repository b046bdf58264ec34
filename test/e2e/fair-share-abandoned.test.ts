// A tenant that abandons its non-streamed requests while they run pays for their output. vLLM
// writes a non-streamed answer only once it is generated, so nothing is seen of its output
// while it runs, and a run its client cancels ends without `usage`: charged its prompt alone,
// such a tenant would be served again and again while the other waits. The leader reserves a
// non-streamed request's output (its limit) at release and keeps it charged when the run ends
// without usage. Alpha abandons three non-streamed requests of 200 tokens; beta streams three
// of 200: both backlogged behind one slot, they alternate, and alpha's counter grew by at least
// the reservations. Every wait is for an event (the engine has a request, a snapshot is newer
// than the end); nothing is timed.
import { decodePoolStats, keySpace, type PoolStats } from '@sluice/protocol';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  answer,
  eventually,
  startStack,
  streamStarted,
  tenantPoolYaml,
  untilReady,
  type SluiceProcess,
  type Stack,
  type TestEngineSim,
} from '../support/index.ts';

const KEYS = {
  alpha: 'sk-alpha-abandoned-test-01234567',
  beta: 'sk-beta-abandoned-test-012345678',
  gamma: 'sk-gamma-abandoned-test-01234567',
};
type Tenant = keyof typeof KEYS;
const keys = keySpace('sluice');
const MAX_TOKENS = 200;
const EACH = 3;

let stack: Stack;
let sim: TestEngineSim;
let gateway: SluiceProcess;
let client: Redis;

beforeAll(async () => {
  stack = await startStack({
    // Each streamed answer is 200 decode steps: it runs while the other tenant's wait.
    sim: ['--max-num-seqs', '64', '--decode-seconds-per-sequence', '0.005'],
    config: ({ url }) =>
      tenantPoolYaml({ tenants: KEYS, engineUrl: url, maxInflight: 1, queueDepth: 100 }),
  });
  ({ sim, gateway } = stack);
  client = new Redis(stack.redis.url);
  await untilReady(gateway);
}, 60_000);

afterAll(async () => {
  await client?.quit();
  await stack?.stop();
});

function ask(tenant: Tenant, content: string, extra: object, signal?: AbortSignal) {
  return fetch(`${gateway.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${KEYS[tenant]}` },
    body: JSON.stringify({
      model: 'm',
      messages: [{ role: 'user', content }],
      ignore_eos: true,
      ...extra,
    }),
    ...(signal ? { signal } : {}),
  });
}

/** The user messages the engine received, in the order it received them. */
async function received(): Promise<string[]> {
  const res = await fetch(`${sim.url}/sim/received`);
  const body = (await res.json()) as { requests: Array<{ userHead: string | null }> };
  return body.requests.map((r) => r.userHead ?? '');
}

const queued = (tenant: Tenant) => client.zcard(keys.tenantQueued('main', tenant));

/** The first snapshot the leader publishes that satisfies `check`. */
function published(check: (s: PoolStats) => boolean, what: string): Promise<PoolStats> {
  return eventually(async () => {
    const text = await client.get(keys.poolStats('main'));
    const stats = text ? decodePoolStats(text) : undefined;
    return stats && check(stats) ? stats : undefined;
  }, what);
}

describe('fair share with abandoned non-streamed requests', () => {
  it("charges alpha its reserved output for the answers it abandons: beta's turns are not taken", async () => {
    // Gamma holds the one slot while both tenants queue, so that the first pick sees them both.
    const hold = new AbortController();
    const holding = await ask(
      'gamma',
      'gamma hold',
      { stream: true, max_tokens: 20_000 },
      hold.signal,
    );
    expect(holding.status).toBe(200);
    const { rest } = await streamStarted(holding);
    rest.catch(() => {});

    const abandon = new Map<string, AbortController>();
    const alpha = Array.from({ length: EACH }, (_, i) => {
      const abort = new AbortController();
      abandon.set(`alpha ${i}`, abort);
      return answer(ask('alpha', `alpha ${i}`, { max_tokens: MAX_TOKENS }, abort.signal));
    });
    const beta = Array.from({ length: EACH }, (_, i) =>
      answer(ask('beta', `beta ${i}`, { stream: true, max_tokens: MAX_TOKENS })),
    );
    await eventually(
      async () =>
        ((await queued('alpha')) === EACH && (await queued('beta')) === EACH) || undefined,
      'both tenants to have their requests queued',
    );
    hold.abort();

    // Each of alpha's is abandoned by its client once the engine runs it, before its answer.
    while (abandon.size > 0) {
      const running = await eventually(
        async () => (await received()).find((m) => abandon.has(m)),
        "one of alpha's requests to run",
      );
      abandon.get(running)!.abort();
      abandon.delete(running);
    }
    const betaAnswers = await Promise.all(beta);
    expect(betaAnswers.map((a) => a.status)).toEqual(beta.map(() => 200));
    for (const a of betaAnswers) expect(a.body.endsWith('data: [DONE]\n\n')).toBe(true);
    // Alpha's clients got no answer: they left.
    for (const a of await Promise.all(alpha)) expect(a.body).not.toContain('"choices"');

    // The release order (one slot: the order the engine received them).
    const order = (await received())
      .filter((m) => m.startsWith('alpha ') || m.startsWith('beta '))
      .map((m) => m.split(' ')[0]!);
    expect(order).toHaveLength(2 * EACH);
    // Alternating, or beta ahead: never two of alpha's more than beta's. Charged its prompts
    // alone, alpha went again after its first abandoned run (alpha beta alpha alpha beta beta).
    let lead = 0;
    for (const tenant of order) {
      lead += tenant === 'alpha' ? 1 : -1;
      expect(lead, order.join(' ')).toBeLessThanOrEqual(1);
    }

    // Once every run ended: alpha paid at least its reservations (limit x output weight 2), and
    // stands within one answer of beta, which paid the tokens it was streamed.
    const doneAt = Date.now();
    const after = await published(
      (s) =>
        s.at > doneAt && s.tenants?.['alpha']?.inflight === 0 && s.tenants['beta']?.inflight === 0,
      'a snapshot after every run ended',
    );
    const alphaTokens = after.tenants!['alpha']!.virtualTokens;
    const betaTokens = after.tenants!['beta']!.virtualTokens;
    console.log(
      `abandoned: order ${order.join(' ')}; virtual tokens alpha ${alphaTokens}, beta ${betaTokens}`,
    );
    expect(alphaTokens).toBeGreaterThanOrEqual(EACH * 2 * MAX_TOKENS);
    expect(betaTokens).toBeGreaterThanOrEqual(EACH * 2 * MAX_TOKENS);
    expect(Math.abs(alphaTokens - betaTokens)).toBeLessThanOrEqual(2 * MAX_TOKENS);
  });
});
