// Sluice on a three-master Redis Cluster (REDIS_CLUSTER_NODES): the core scenarios — the cap
// across gateway replicas, cancellation, queue full, leader failover — and two pools whose
// keys each share one hash slot, on different masters.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Cluster } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  alive,
  answer,
  askNode,
  chat,
  eventually,
  metricSum,
  queuedJobs,
  readAll,
  startCluster,
  startDispatcher,
  startEngineSim,
  startGateway,
  type SluiceProcess,
  type TestCluster,
  type TestEngineSim,
} from '../support/index.ts';

const CAP = 2;
let cluster: TestCluster;
let client: Cluster;

beforeAll(async () => {
  cluster = await startCluster();
  client = cluster.client();
}, 120_000);

afterAll(async () => {
  client?.disconnect();
  await cluster?.stop();
});

/** Every request id the engine has received so far (a replayed request repeats its id). */
async function receivedIds(sim: TestEngineSim): Promise<string[]> {
  return ((await (await fetch(`${sim.url}/sim/received`)).json()) as { ids: string[] }).ids;
}

/** Opens an endless stream and resolves once the engine sends its first token. */
async function openStream(base: string, content: string, signal?: AbortSignal) {
  const res = await chat(
    base,
    content,
    { stream: true, max_tokens: 100_000, ignore_eos: true },
    signal,
  );
  expect(res.status).toBe(200);
  const reader = res.body!.getReader();
  const decoder = new TextDecoder();
  let text = '';
  while (!text.includes('data: ')) {
    const { value, done } = await reader.read();
    if (done) break;
    text += decoder.decode(value, { stream: true });
  }
  const rest = (async () => {
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) return text;
        text += decoder.decode(value, { stream: true });
      }
    } catch (err) {
      return `${text}\ntransport error: ${String(err)}`;
    }
  })();
  return { rest };
}

describe('the core scenarios on a three-master cluster', () => {
  let sim: TestEngineSim;
  let dispatchers: SluiceProcess[] = [];
  let gateways: SluiceProcess[] = [];
  /** Refuses once 3 jobs are queued: for queue full. */
  let tight: SluiceProcess;
  let env: Record<string, string>;

  beforeAll(async () => {
    // 10 ms a token: a short answer takes tens of milliseconds (the cap is really exercised),
    // and an endless stream holds its slot until its client leaves.
    sim = await startEngineSim([
      '--profile',
      'instant',
      '--model',
      'm',
      '--max-num-seqs',
      '64',
      '--decode-seconds-per-sequence',
      '0.01',
    ]);
    env = {
      ...cluster.env,
      VLLM_URL: sim.url,
      VLLM_MODEL: 'm',
      ADMISSION_MAX_INFLIGHT: String(CAP),
      VLLM_MAX_QUEUE_DEPTH: '1000',
      SLUICE_DEGRADATION: 'off',
      SLUICE_LEASE_TTL_MS: '1000',
      SLUICE_RELAY_LIVENESS_MS: '200',
      SLUICE_RELAY_SILENCE_TIMEOUT_MS: '1000',
      NODE_OPTIONS: '--unhandled-rejections=strict',
    };
    const first = await startDispatcher({ ...env, SLUICE_DISPATCHER_ID: 'first' });
    dispatchers = [first];
    // The first one leads before the standby starts.
    await first.process.waitForLine(/lease acquired/, 60_000);
    dispatchers.push(await startDispatcher({ ...env, SLUICE_DISPATCHER_ID: 'second' }));
    gateways = await Promise.all([startGateway(env), startGateway(env)]);
    tight = await startGateway({ ...env, VLLM_MAX_QUEUE_DEPTH: '3' });
  }, 120_000);

  afterAll(async () => {
    for (const p of [tight, ...gateways, ...dispatchers]) await p?.stop();
    await sim?.stop();
  });

  const queued = () => queuedJobs(client);

  /** Two endless streams that hold both slots until the returned function frees them. */
  async function fillCap() {
    const controller = new AbortController();
    await Promise.all(
      [0, 1].map((i) =>
        openStream(gateways[i]!.url, `blocker ${i} ${Math.random()}`, controller.signal),
      ),
    );
    await eventually(
      async () => (await sim.state()).running === CAP,
      'both blockers on the engine',
    );
    return async () => {
      controller.abort();
      await eventually(async () => (await sim.state()).running === 0, 'the blockers to leave');
    };
  }

  it('holds the cap across two gateways: 40 requests (half streaming) intact, byte-identical to the engine, never above 2', async () => {
    await fetch(`${sim.url}/sim/peak/reset`, { method: 'POST' });
    const payloads = Array.from({ length: 40 }, (_, i) => ({
      content: `cluster cap ${i}`,
      extra: { max_tokens: 8 + (i % 17), stream: i % 2 === 0 },
    }));
    const viaSluice = await Promise.all(
      payloads.map((p, i) => answer(chat(gateways[i % 2]!.url, p.content, p.extra))),
    );
    const state = await sim.state();
    expect(state.peakRequests).toBe(CAP); // reached, and never passed

    const direct = await Promise.all(
      payloads.map((p) => answer(chat(sim.url, p.content, p.extra))),
    );
    for (let i = 0; i < payloads.length; i += 1) {
      expect(viaSluice[i]!.status).toBe(200);
      expect(viaSluice[i]!.body).toBe(direct[i]!.body);
    }
  }, 120_000);

  it('frees the engine slot of a client that disconnects mid-stream', async () => {
    const controller = new AbortController();
    await openStream(gateways[0]!.url, 'leaves mid-stream', controller.signal);
    expect((await sim.state()).running).toBe(1);
    controller.abort();
    await eventually(async () => (await sim.state()).running === 0, 'the engine to free the slot');
    expect((await sim.state()).usedBlocks).toBe(0);
  });

  it('removes the job of a client that disconnects while queued; it never reaches the engine', async () => {
    const free = await fillCap();
    let before = 0;
    try {
      before = (await sim.state()).receivedTotal as number;
      const controller = new AbortController();
      const pending = chat(gateways[1]!.url, 'never runs', {}, controller.signal).catch(
        () => undefined,
      );
      await eventually(async () => (await queued()) === 1, 'the job to be queued');
      controller.abort();
      await pending;
      await eventually(async () => (await queued()) === 0, 'the job to be removed');
    } finally {
      await free();
    }
    // A request sent now runs; the abandoned one never did.
    expect((await answer(chat(gateways[0]!.url, 'runs', { max_tokens: 2 }))).status).toBe(200);
    expect((await sim.state()).receivedTotal).toBe(before + 1);
  });

  it('refuses with 503 queue_full and Retry-After once VLLM_MAX_QUEUE_DEPTH jobs are queued', async () => {
    const free = await fillCap();
    try {
      const controller = new AbortController();
      const waiting = [0, 1, 2].map((i) =>
        chat(tight.url, `queued ${i}`, {}, controller.signal).catch(() => undefined),
      );
      await eventually(async () => (await queued()) === 3, 'three queued jobs');
      const refused = await answer(chat(tight.url, 'one too many'));
      expect(refused.status).toBe(503);
      expect(refused.reason).toBe('queue_full');
      expect(refused.retryAfter).toMatch(/^\d+$/);
      expect(JSON.parse(refused.body).error.code).toBe('queue_full');
      controller.abort();
      await Promise.all(waiting);
      await eventually(async () => (await queued()) === 0, 'aborted clients to leave the queue');
    } finally {
      await free();
    }
  });

  it('after SIGKILL of the leading dispatcher, the standby serves the queued jobs; nothing runs twice; the cap holds', async () => {
    await fetch(`${sim.url}/sim/peak/reset`, { method: 'POST' });
    const idsBefore = (await receivedIds(sim)).length;
    const streams = await Promise.all(
      [0, 1].map((i) => openStream(gateways[i]!.url, `in flight at the kill ${i}`)),
    );
    const queuedAnswers = [0, 1, 2].map((i) =>
      answer(chat(gateways[i % 2]!.url, `queued at the kill ${i}`, { max_tokens: 4 })),
    );
    await eventually(async () => (await queued()) === 3, 'three queued jobs');

    await dispatchers[0]!.stop('SIGKILL');

    // The in-flight streams end with an explicit in-band error, not a silent truncation.
    for (const text of await Promise.all(streams.map((s) => s.rest)))
      expect(text).toMatch(
        /data: \{"error":\{"message":"[^"]+","type":"server_error","param":null,"code":"(dispatcher_lost|engine_error)"\}\}\n\ndata: \[DONE\]\n\n$/,
      );
    // The standby takes the lease and releases the queued jobs.
    for (const a of await Promise.all(queuedAnswers)) {
      expect(a.status).toBe(200);
      expect(JSON.parse(a.body).choices[0].message.content).toMatch(/\w/);
    }
    await dispatchers[1]!.process.waitForLine(/lease acquired/);
    expect(alive(dispatchers[1]!)).toBe(true);

    const ids = (await receivedIds(sim)).slice(idsBefore);
    expect(ids).toHaveLength(5);
    expect(new Set(ids).size).toBe(ids.length);
    expect((await sim.state()).peakRequests).toBeLessThanOrEqual(CAP);
  }, 120_000);
});

describe('two pools on a cluster', () => {
  const PREFIX = 'twopools';
  // `{pool-chat}` hashes to slot 3499 (the first master's range), `{pool-code}` to 13790 (the
  // third's): the hash tags differ, so the pools land on different masters.
  const pools = ['chat', 'code'] as const;
  const TENANT_KEYS = {
    alpha: 'sk-cluster-alpha-0123456789abcde',
    beta: 'sk-cluster-beta-0123456789abcdef',
  };
  let sims: TestEngineSim[] = [];
  let dispatcher: SluiceProcess;
  let gateway: SluiceProcess;
  let dir: string;

  beforeAll(async () => {
    sims = await Promise.all(
      pools.map((model) => startEngineSim(['--profile', 'instant', '--model', model])),
    );
    dir = mkdtempSync(join(tmpdir(), 'sluice-cluster-pools-'));
    const config = join(dir, 'sluice.yaml');
    writeFileSync(
      config,
      [
        // Keyed tenants: the fair share's scripts run on the cluster too (its reading goes
        // ahead of each take on BullMQ's connection, its tenant sets carry the pool's tag).
        'tenants:',
        ...Object.entries(TENANT_KEYS).flatMap(([name, key]) => [
          `  - name: ${name}`,
          `    apiKeys: [${key}]`,
        ]),
        'pools:',
        ...pools.flatMap((name, i) => [
          `  - name: ${name}`,
          `    models: [${name}]`,
          '    engines:',
          `      - { url: "${sims[i]!.url}", name: e${i}, maxInflight: 1 }`,
        ]),
        '',
      ].join('\n'),
    );
    const env = { ...cluster.env, SLUICE_CONFIG: config, SLUICE_REDIS_PREFIX: PREFIX };
    dispatcher = await startDispatcher(env);
    gateway = await startGateway(env);
  }, 120_000);

  afterAll(async () => {
    await gateway?.stop();
    await dispatcher?.stop();
    await Promise.all(sims.map((s) => s.stop()));
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  /** Every key on every master whose name mentions `word`. */
  async function keysMentioning(word: string): Promise<string[]> {
    const perNode = await Promise.all(
      cluster.nodes.map((node) => askNode(node.port, (r) => r.keys(`*${word}*`))),
    );
    return perNode.flat();
  }

  it('serves each pool to two tenants, and keeps every key of a pool in the one slot of its hash tag', async () => {
    // Ready: Redis answers and each pool has a leader (the lease may take a moment on a cluster).
    // Should it time out, the last answer and both processes' last lines say which pool
    // lacked a leader and why.
    let lastReadyz = '';
    await eventually(async () => {
      const res = await fetch(`${gateway.url}/readyz`);
      lastReadyz = await res.text();
      return res.status === 200 ? true : undefined;
    }, 'the gateway to see a leader for each pool').catch((err: Error) => {
      const tail = (p: SluiceProcess) => p.process.output.slice(-20).join('\n');
      throw new Error(
        `${err.message}; last /readyz: ${lastReadyz}\ndispatcher:\n${tail(dispatcher)}\ngateway:\n${tail(gateway)}`,
      );
    });
    // Both tenants on both pools, at once: with a cap of 1 the fair share picks between them.
    const answers = await Promise.all(
      pools.flatMap((model) =>
        Object.values(TENANT_KEYS).flatMap((key) =>
          Array.from({ length: 3 }, () =>
            fetch(`${gateway.url}/v1/chat/completions`, {
              method: 'POST',
              headers: { 'content-type': 'application/json', authorization: `Bearer ${key}` },
              body: JSON.stringify({
                model,
                messages: [{ role: 'user', content: 'hi' }],
                max_tokens: 3,
              }),
            }).then(async (res) => ({ status: res.status, body: await readAll(res) })),
          ),
        ),
      ),
    );
    for (const a of answers) {
      expect(a.status, a.body).toBe(200);
      expect(a.body).toContain('"choices"');
    }
    // The fair share picked before the takes, its reading script answering on the cluster.
    expect(await metricSum(dispatcher.url, 'sluice_fair_share_picks_total')).toBeGreaterThan(0);
    const metrics = await (await fetch(`${dispatcher.url}/metrics`)).text();
    expect(metrics).not.toMatch(/sluice_fair_share_picks_total\{[^}]*outcome="read_failed"/);
    const slots: number[] = [];
    for (const pool of pools) {
      const tag = `{pool-${pool}}`;
      const slot = await cluster.keySlot(tag);
      slots.push(slot);
      // Every key that names the pool carries its tag: BullMQ's and Sluice's own.
      const keys = await eventually(async () => {
        const found = await keysMentioning(pool);
        return found.includes(`${PREFIX}:${tag}:lease`) ? found : undefined;
      }, `the ${pool} pool's lease key`);
      expect(keys).toContain(`${PREFIX}:${tag}:meta`);
      for (const key of keys) {
        expect(key.startsWith(`${PREFIX}:${tag}:`), key).toBe(true);
        expect(await cluster.keySlot(key)).toBe(slot);
      }
    }
    expect(slots[0]).not.toBe(slots[1]);
    const owners = await Promise.all(pools.map((p) => cluster.nodeOf(`{pool-${p}}`)));
    expect(owners[0]).not.toBe(owners[1]);
  }, 120_000);
});
