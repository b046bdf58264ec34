// What a gateway's /metrics shows before any request, on the real gateway (startGateway, a real
// redis-server): a refusal series at 0 for every routed model and reason (a first refusal is
// then a change that rate() sees: the alert on a gateway's first dispatcher_lost fires), also
// for a model learnt from its engine after start; and each pool's leader as the gateway sees
// it (sluice_pool_has_leader, which SluiceNoLeader reads). Then the TTFT histogram's hook:
// streamed answers only.
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { loadConfig } from '@sluice/config';
import { gatewayMetrics, Registry } from '@sluice/observability';
import { keySpace, refusalKinds } from '@sluice/protocol';
import { createRedis, redisReady, type Redis } from '@sluice/redis';
import { eventually, startRedis, type TestRedis } from '@sluice/test/support';
import { request } from 'undici';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { heldHooks, type HeldHooksDeps } from '../src/held-hooks.ts';
import type { HeldRequest } from '../src/held-request.ts';
import { startGateway, type Gateway } from '../src/main.ts';
import type { PoolQueue } from '../src/pool-queue.ts';

const keys = keySpace('sluice');
const reasons = Object.keys(refusalKinds);

let server: TestRedis;
let redis: Redis;
/** Serves /v1/models as a vLLM engine would, for the pool whose model is discovered. */
let engine: Server;
let engineUrl: string;
const gateways: Gateway[] = [];

beforeAll(async () => {
  server = await startRedis();
  redis = createRedis(server.url, { name: 'test', role: 'command' });
  await redisReady(redis);
  engine = createServer((req, res) => {
    if (req.url !== '/v1/models') return res.writeHead(404).end();
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ object: 'list', data: [{ id: 'found', object: 'model' }] }));
  });
  await new Promise<void>((resolve) => engine.listen(0, '127.0.0.1', resolve));
  engineUrl = `http://127.0.0.1:${(engine.address() as AddressInfo).port}`;
});

afterEach(async () => {
  for (const gateway of gateways.splice(0)) await gateway.close();
  await redis.flushall();
});

afterAll(async () => {
  await redis?.quit();
  await server?.stop();
  await new Promise((resolve) => engine?.close(resolve));
});

async function start(env: Record<string, string>, yaml?: string): Promise<Gateway> {
  const gateway = await startGateway(
    loadConfig(
      {
        REDIS_URL: server.url,
        HOST: '127.0.0.1',
        PORT: '0',
        LOG_LEVEL: 'silent',
        SLUICE_SHUTDOWN_DRAIN_SECONDS: '0',
        ...(yaml === undefined ? {} : { SLUICE_CONFIG: '/etc/sluice.yaml' }),
        ...env,
      },
      () => yaml ?? '',
    ),
  );
  gateways.push(gateway);
  return gateway;
}

async function scrape(gateway: Gateway): Promise<string> {
  const res = await request(`${gateway.url}/metrics`);
  return res.body.text();
}

/** The value of one series, as written (`name{labels}`); undefined when absent. */
function value(text: string, series: string): number | undefined {
  const line = text.split('\n').find((l) => l.startsWith(`${series} `));
  return line === undefined ? undefined : Number(line.slice(series.length + 1));
}

const rejected = (model: string, reason: string) =>
  `sluice_rejected_total{model="${model}",reason="${reason}"}`;
const hasLeader = (pool: string) => `sluice_pool_has_leader{pool="${pool}"}`;

const TWO_POOLS = [
  'pools:',
  '  - name: a',
  '    models: [m1, m2]',
  '    engines:',
  '      - { url: "http://127.0.0.1:1", name: e }',
  '  - name: b',
  '    models: [m3]',
  '    engines:',
  '      - { url: "http://127.0.0.1:2", name: f }',
  'passthrough:',
  '  - { model: embed, url: "http://127.0.0.1:3" }',
  '',
].join('\n');

describe('refusal series of a fresh gateway', () => {
  it('are at 0 for every routed model and every reason of the refusal table, before any request', async () => {
    const text = await scrape(await start({}, TWO_POOLS));
    for (const model of ['m1', 'm2', 'm3', 'embed'])
      for (const reason of reasons)
        expect({
          series: rejected(model, reason),
          value: value(text, rejected(model, reason)),
        }).toEqual({ series: rejected(model, reason), value: 0 });
    // Only configured models: `unknown` gets its series with its first refusal.
    expect(text).not.toContain('model="unknown"');
  });

  it('are at 0 for a model learnt from the engine once it is known', async () => {
    const gateway = await start({ VLLM_URL: engineUrl });
    await eventually(
      async () => value(await scrape(gateway), rejected('found', 'dispatcher_lost')) === 0,
      'the discovered model to have its refusal series',
    );
    const text = await scrape(gateway);
    for (const reason of reasons) expect(value(text, rejected('found', reason))).toBe(0);
  });
});

describe('sluice_pool_has_leader', () => {
  it('says, for every pool, whether the gateway sees its lease held: also for a pool nobody leads', async () => {
    await redis.set(keys.lease('a'), 'dispatcher-1');
    const gateway = await start({}, TWO_POOLS);
    await eventually(async () => {
      const text = await scrape(gateway);
      return value(text, hasLeader('a')) === 1 && value(text, hasLeader('b')) === 0;
    }, 'pool a led and pool b without a leader');
    // /readyz reads the same: the metric says what requests get.
    const ready = await request(`${gateway.url}/readyz`);
    expect(await ready.body.json()).toMatchObject({ leaders: { a: true, b: false } });

    // A dispatcher takes pool b.
    await redis.set(keys.lease('b'), 'dispatcher-2');
    await eventually(async () => value(await scrape(gateway), hasLeader('b')) === 1, 'pool b led');
  });

  it('has no series while the gateway cannot reach Redis: it cannot tell', async () => {
    const own = await startRedis();
    const gateway = await start({ REDIS_URL: own.url }, TWO_POOLS);
    try {
      await eventually(
        async () => value(await scrape(gateway), hasLeader('a')) === 0,
        'the gateway to read the leases',
      );
      await own.stop();
      await eventually(
        async () => !(await scrape(gateway)).includes('sluice_pool_has_leader{'),
        'the series to go with Redis',
      );
    } finally {
      await own.stop();
    }
  });
});

describe('sluice_ttft_seconds', () => {
  /** The hooks of a held request, on a registry of their own. */
  function hooks() {
    const registry = new Registry();
    const metrics = gatewayMetrics(registry);
    const deps = { metrics, now: Date.now } as unknown as HeldHooksDeps;
    const pool = { pool: { name: 'p', maxParkSeconds: 60 } } as unknown as PoolQueue;
    const count = async () =>
      (await metrics.ttft.get()).values.find((v) => v.metricName === 'sluice_ttft_seconds_count')
        ?.value ?? 0;
    return {
      hooks: heldHooks(deps, pool, { id: 'r', model: 'm', promptTokens: 1 }),
      count,
    };
  }
  const held = (stream: boolean) =>
    ({ stream, receivedAt: 1000, firstByteAt: 61_000 }) as unknown as HeldRequest;

  it("observes a stream's first byte", async () => {
    const { hooks: h, count } = hooks();
    h.onFirstByte(held(true));
    expect(await count()).toBe(1);
  });

  it("does not observe a non-streamed answer's first byte: it comes with the whole answer", async () => {
    const { hooks: h, count } = hooks();
    h.onFirstByte(held(false));
    expect(await count()).toBe(0);
  });
});
