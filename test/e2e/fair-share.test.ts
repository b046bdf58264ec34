// Two tenants share one engine of cap 2 behind two gateways. Alpha floods; beta sends a few
// just after. The fair share releases beta's requests among alpha's backlog instead of after
// it, alpha is held to its own queue bound, and the engine never runs more than the cap.
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  answer,
  eventually,
  metricSum,
  startStack,
  type SluiceProcess,
  type Stack,
  type TestEngineSim,
} from '../support/index.ts';

const ALPHA_KEY = 'sk-alpha-fair-share-test-0123456';
const BETA_KEY = 'sk-beta-fair-share-test-01234567';

let stack: Stack;
let sim: TestEngineSim;
let dispatcher: SluiceProcess;
/** Stands by until the failover test stops the leader. */
let standby: SluiceProcess;
let gateways: SluiceProcess[];
let client: Redis;

beforeAll(async () => {
  stack = await startStack({
    // Every answer is 30 decode steps long, so alpha's backlog takes a while to drain.
    sim: ['--max-num-seqs', '64', '--decode-seconds-per-sequence', '0.005'],
    config: ({ url }) =>
      [
        'tenants:',
        '  - name: alpha',
        `    apiKeys: [${ALPHA_KEY}]`,
        '    maxQueued: 20',
        '  - name: beta',
        `    apiKeys: [${BETA_KEY}]`,
        'pools:',
        '  - name: main',
        '    models: [m]',
        '    queueDepth: 100',
        '    maxParkSeconds: 300',
        '    engines:',
        `      - { url: "${url}", name: e, maxInflight: 2 }`,
        '',
      ].join('\n'),
    // A leader before the flood: otherwise the first requests are refused no_leader. The
    // standby is started once the first one leads pool main, so the first one is the leader.
    dispatcherIds: ['leader', 'standby'],
    leasePool: 'main',
    gateways: 2,
  });
  ({ sim, gateways } = stack);
  dispatcher = stack.dispatcher;
  standby = stack.dispatchers[1]!;
  client = new Redis(stack.redis.url);
});

afterAll(async () => {
  await client?.quit();
  await stack?.stop();
});

function ask(gateway: SluiceProcess, key: string, content: string) {
  return fetch(`${gateway.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${key}` },
    body: JSON.stringify({
      model: 'm',
      messages: [{ role: 'user', content }],
      max_tokens: 30,
      ignore_eos: true,
    }),
  });
}

/**
 * `sluice_tenant_rejected_total` of a gateway, summed: with tenants the API port's /metrics
 * needs a key (any tenant's).
 */
async function tenantRejected(gateway: SluiceProcess): Promise<number> {
  const res = await fetch(`${gateway.url}/metrics`, {
    headers: { authorization: `Bearer ${ALPHA_KEY}` },
  });
  return (await res.text())
    .split('\n')
    .filter((l) => l.startsWith('sluice_tenant_rejected_total{'))
    .reduce((sum, l) => sum + Number(l.split(' ').pop()), 0);
}

describe('fair share between two tenants', () => {
  it("serves beta's few requests among alpha's backlog, and bounds alpha's queue", async () => {
    const started = Date.now();
    const finished: Array<{ tenant: 'alpha' | 'beta'; at: number; status: number }> = [];
    const send = (tenant: 'alpha' | 'beta', i: number) =>
      answer(
        ask(gateways[i % 2]!, tenant === 'alpha' ? ALPHA_KEY : BETA_KEY, `${tenant} ${i}`),
      ).then((a) => {
        finished.push({ tenant, at: Date.now(), status: a.status });
        return a;
      });
    let firstRefusal!: () => void;
    const alphaFull = new Promise<void>((resolve) => (firstRefusal = resolve));
    const alpha = Array.from({ length: 40 }, (_, i) =>
      send('alpha', i).then((a) => {
        if (a.status === 429) firstRefusal();
        return a;
      }),
    );
    // Beta comes once alpha's queue is full (its first refusal): the backlog is there to jump.
    await Promise.race([alphaFull, Promise.all(alpha)]);
    const betaSentAt = Date.now();
    const beta = Array.from({ length: 4 }, (_, i) => send('beta', i));
    const [alphaAnswers, betaAnswers] = await Promise.all([Promise.all(alpha), Promise.all(beta)]);

    const refused = alphaAnswers.filter((a) => a.status === 429);
    const served = alphaAnswers.filter((a) => a.status === 200);
    // Past its 20 queued, alpha is told to come back later; every request taken in is served.
    expect(refused.length).toBeGreaterThan(0);
    expect(served.length + refused.length).toBe(40);
    for (const r of refused) {
      expect(r.reason).toBe('tenant_queue_full');
      expect(Number(r.retryAfter)).toBeGreaterThanOrEqual(1);
      expect(JSON.parse(r.body).error.code).toBe('tenant_queue_full');
    }
    for (const a of [...served, ...betaAnswers]) expect(JSON.parse(a.body).choices).toHaveLength(1);
    expect(betaAnswers.map((a) => a.status)).toEqual([200, 200, 200, 200]);

    // Ordering, not speed: how many of alpha's served requests ended before beta's last one.
    // First come, first served puts all of alpha's queue first; the fair share alternates.
    const betaLast = Math.max(...finished.filter((f) => f.tenant === 'beta').map((f) => f.at));
    const alphaDone = finished.filter((f) => f.tenant === 'alpha' && f.status === 200);
    const alphaBefore = alphaDone.filter((f) => f.at < betaLast).length;
    const alphaLast = Math.max(...alphaDone.map((f) => f.at));
    console.log(
      `fair share: alpha served ${served.length}, refused ${refused.length}; ` +
        `${alphaBefore} of alpha's ended before beta's last; after beta sent, its last answer ` +
        `came in ${betaLast - betaSentAt} ms and alpha's backlog drained in ${alphaLast - betaSentAt} ms ` +
        `(flood sent ${betaSentAt - started} ms before)`,
    );
    expect(alphaBefore).toBeLessThanOrEqual(Math.ceil(served.length / 2));

    // The cap held throughout, and the engine ran exactly what was served.
    const state = await sim.state();
    expect(state.peakRequests).toBe(2);
    expect(state.receivedTotal).toBe(served.length + 4);

    // Metrics name the tenants: released per tenant, tokens served, refusals by reason.
    expect(await metricSum(dispatcher.url, 'sluice_tenant_released_total')).toBe(served.length + 4);
    const refusedSeen = (await tenantRejected(gateways[0]!)) + (await tenantRejected(gateways[1]!));
    expect(refusedSeen).toBe(refused.length);
    expect(await metricSum(dispatcher.url, 'sluice_tenant_tokens_total')).toBeGreaterThan(0);
    // Slots went straight from one job to the next (the fair share picking each), and the
    // order above held all the same.
    expect(await metricSum(dispatcher.url, 'sluice_handovers_total')).toBeGreaterThan(0);
  });
});

describe('fair share across a change of leader', () => {
  it('hands the counters to the standby: they never go back, and every request is served', async () => {
    const key = 'sluice:{pool-main}:fair-share';
    const counterOf = async () => Number((await client.hget(key, 'alpha')) ?? 0);
    // Every value the hash holds while the leader changes, read as fast as Redis answers.
    const seen: number[] = [];
    let watching = true;
    const watch = (async () => {
      while (watching) seen.push(await counterOf());
    })();
    const before = (await sim.state()).receivedTotal as number;
    const released = () => metricSum(dispatcher.url, 'sluice_tenant_released_total');
    const releasedBefore = (await released()) ?? 0;
    const requests = [
      ...Array.from({ length: 12 }, (_, i) => answer(ask(gateways[i % 2]!, ALPHA_KEY, `a ${i}`))),
      ...Array.from({ length: 4 }, (_, i) => answer(ask(gateways[i % 2]!, BETA_KEY, `b ${i}`))),
    ];
    await eventually(
      async () => (((await released()) ?? 0) - releasedBefore >= 5 ? true : undefined),
      'the leader to release five of them',
    );
    // SIGTERM: the leader writes its counters, hands the lease over, finishes what it runs.
    await dispatcher.stop('SIGTERM');
    const atHandover = await counterOf();
    const answers = await Promise.all(requests);
    expect(answers.map((a) => a.status)).toEqual(answers.map(() => 200));
    // The standby led and released the rest, going on from the counters it read.
    expect(await metricSum(standby.url, 'sluice_leader')).toBe(1);
    expect(((await metricSum(standby.url, 'sluice_tenant_released_total')) ?? 0) > 0).toBe(true);
    await eventually(
      async () => ((await counterOf()) > atHandover ? true : undefined),
      "the new leader's first write of the counters",
    );
    watching = false;
    await watch;
    const drops = seen.filter((v, i) => i > 0 && v < seen[i - 1]!);
    expect(drops).toEqual([]);
    expect(atHandover).toBeGreaterThan(0);
    // Nothing ran twice, and the cap held across the change.
    const state = await sim.state();
    expect((state.receivedTotal as number) - before).toBe(16);
    expect(state.peakRequests).toBe(2);
  });
});
