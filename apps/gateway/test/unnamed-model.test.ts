// A request without a model, as vLLM takes one (`model: str | None = None`; an engine serves it
// with its first model): routed to the pool when the gateway fronts exactly one pool and no
// pass-through backend, with the body as sent; otherwise 400 naming the models. A real
// redis-server behind PoolQueue (its leader check), a real Fastify app with the route; the
// add is replaced so the test reads what would be queued.
import { loadConfig, type SluiceConfig } from '@sluice/config';
import { gatewayMetrics, Registry, type GatewayMetrics } from '@sluice/observability';
import { keySpace, type JobPayload, type QueueLevel } from '@sluice/protocol';
import { createRedis, redisReady, type Redis } from '@sluice/redis';
import { startRedis, type TestRedis } from '@sluice/test/support';
import Fastify, { type FastifyInstance } from 'fastify';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { installAuth } from '../src/auth.ts';
import { heldHooks } from '../src/held-hooks.ts';
import type { Passthrough } from '../src/passthrough.ts';
import { PoolQueue } from '../src/pool-queue.ts';
import { refusalBody, refusalHeaders } from '../src/refuse.ts';
import { ReplyRouter } from '../src/replies.ts';
import { Routing } from '../src/routing.ts';
import { acceptRawJson, completionRoutes } from '../src/routes/completions.ts';

const keys = keySpace('sluice');

let server: TestRedis;
let redis: Redis;
let bull: Redis;
let replies: ReplyRouter;

beforeAll(async () => {
  server = await startRedis();
  redis = createRedis(server.url, { name: 'cmd', role: 'command' });
  bull = createRedis(server.url, { name: 'bull', role: 'bullmq' });
  await Promise.all([redisReady(redis), redisReady(bull)]);
  // Never started: nothing is held to the end here.
  replies = new ReplyRouter(
    redis,
    'replies',
    60_000,
    Date.now,
    () => {},
    () => {},
  );
});
afterAll(async () => {
  replies.stop();
  await Promise.all([redis.quit(), bull.quit()]);
  await server.stop();
});

interface Gateway {
  app: FastifyInstance;
  metrics: GatewayMetrics;
  /** What each request would have queued: its payload and level. */
  added: [JobPayload, QueueLevel][];
  /** The model label and reason of each refusal the route answered itself. */
  refused: [string, string][];
  queues: PoolQueue[];
}

let gateway: Gateway | undefined;
afterEach(async () => {
  if (!gateway) return;
  await gateway.app.close();
  await Promise.all(gateway.queues.map((q) => q.close()));
  gateway = undefined;
});

/** The completion routes for `config`, every pool led, every add refused `queue_full`. */
async function start(config: SluiceConfig): Promise<Gateway> {
  await redis.flushall();
  const added: [JobPayload, QueueLevel][] = [];
  const refused: [string, string][] = [];
  const pools = new Map<string, PoolQueue>();
  for (const pool of config.pools) {
    await redis.set(keys.lease(pool.name), 'dispatcher');
    const queue = new PoolQueue(pool, keys, redis, bull, config.limits.maxPriority, Date.now);
    queue.add = (_jobId, payload, level) => {
      added.push([payload, level]);
      return Promise.resolve('queue_full');
    };
    pools.set(pool.name, queue);
  }
  const metrics = gatewayMetrics(new Registry());
  const app = Fastify();
  acceptRawJson(app);
  // Without tenants: every request anonymous (request.tenant null), as main.ts installs it.
  installAuth(app, undefined, (reply) => reply);
  await app.register(completionRoutes, {
    replicaId: 'gw',
    limits: config.limits,
    routing: new Routing(config),
    pools,
    redisUp: () => true,
    replies,
    passthrough: {} as Passthrough,
    metrics,
    now: Date.now,
    heldHooks: (p, info) =>
      heldHooks(
        {
          heartbeatSeconds: 60,
          slowClientBytes: 1024 ** 3,
          slowClientStallSeconds: 60,
          engineDetails: true,
          now: Date.now,
          metrics,
          replies,
          publishCancel: () => {},
          ended: () => {},
        },
        p,
        info,
      ),
    admit: () => undefined,
    refuse: (reply, model, r) => {
      refused.push([model, r.reason]);
      return reply.code(r.status).headers(refusalHeaders(r)).send(refusalBody(r));
    },
    ended: () => {},
  });
  await app.listen({ port: 0, host: '127.0.0.1' });
  gateway = { app, metrics, added, refused, queues: [...pools.values()] };
  return gateway;
}

async function post(
  g: Gateway,
  path: string,
  body: string,
): Promise<{ status: number; reason: string | null; message: string }> {
  const { port } = g.app.server.address() as { port: number };
  const res = await fetch(`http://127.0.0.1:${port}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body,
  });
  const text = await res.text();
  const message = res.headers.get('content-type')?.includes('json')
    ? ((JSON.parse(text) as { error?: { message?: string } }).error?.message ?? '')
    : '';
  return { status: res.status, reason: res.headers.get('x-sluice-reject-reason'), message };
}

const bodyOf = (payload: JobPayload) => Buffer.from(payload.bodyBase64!, 'base64').toString();

const WITHOUT_MODEL = [
  '{"messages":[{"role":"user","content":"hi"}]}',
  '{"model":null,"messages":[{"role":"user","content":"hi"}],"stream":true}',
  '{"model":"","messages":[{"role":"user","content":"hi"}]}',
];

describe('a request without a model', () => {
  it('goes to the one pool, body as sent, labelled with its first model', async () => {
    const g = await start(
      loadConfig({ VLLM_URL: 'http://127.0.0.1:1', VLLM_MODEL: 'm', REDIS_URL: server.url }),
    );
    for (const body of WITHOUT_MODEL) {
      const res = await post(g, '/v1/chat/completions', body);
      // Queued (then refused queue_full by the stand-in add): routed, not a 400.
      expect(res.reason, body).toBe('queue_full');
      expect(bodyOf(g.added.at(-1)![0]), body).toBe(body);
    }
    // vLLM's completions take no model either.
    const completion = '{"prompt":"say hi","max_tokens":5}';
    expect((await post(g, '/v1/completions', completion)).reason).toBe('queue_full');
    const [payload] = g.added.at(-1)!;
    expect(bodyOf(payload)).toBe(completion);
    expect(payload.path).toBe('/v1/completions');
    expect(payload.promptTokens).toBe(2);
    // The metrics say which model: the pool's, never a client's string.
    const requests = (await g.metrics.requests.get()).values;
    expect(requests).toEqual([
      expect.objectContaining({ labels: { model: 'm', kind: 'gated' }, value: 4 }),
    ]);
  });

  it('goes to the one pool while its model is still being discovered, labelled unknown', async () => {
    const g = await start(loadConfig({ VLLM_URL: 'http://127.0.0.1:1', REDIS_URL: server.url }));
    const res = await post(g, '/v1/chat/completions', WITHOUT_MODEL[0]!);
    expect(res.reason).toBe('queue_full');
    expect(g.added).toHaveLength(1);
    expect((await g.metrics.requests.get()).values).toEqual([
      expect.objectContaining({ labels: { model: 'unknown', kind: 'gated' }, value: 1 }),
    ]);
    // A named model that nobody knows yet still waits for discovery.
    expect((await post(g, '/v1/chat/completions', '{"model":"x","messages":[]}')).reason).toBe(
      'engine_unreachable',
    );
  });

  it('is refused 400 naming the models when the gateway has several destinations', async () => {
    const yaml = (passthrough: string) => `pools:
  - name: chat
    models: [llama, llama-alias]
    engines: [{ url: "http://127.0.0.1:1" }]
${passthrough}`;
    for (const config of [
      // two pools
      `${yaml('')}  - name: code
    models: [coder]
    engines: [{ url: "http://127.0.0.1:2" }]
`,
      // one pool and a pass-through backend
      yaml('passthrough:\n  - { model: emb, url: "http://127.0.0.1:3" }\n'),
    ]) {
      const g = await start(
        loadConfig({ SLUICE_CONFIG: '/etc/sluice.yaml', REDIS_URL: server.url }, () => config),
      );
      for (const body of WITHOUT_MODEL) {
        const res = await post(g, '/v1/chat/completions', body);
        expect(res.status, body).toBe(400);
        expect(res.reason).toBe('bad_request');
        expect(res.message).toMatch(/^model is required: /);
        expect(res.message).toContain('served here: llama, llama-alias, ');
        expect(res.message).toContain('GET /v1/models lists them');
      }
      // Counted under no client string: `unknown`, as any request not routed.
      expect(new Set(g.refused.map(([model]) => model))).toEqual(new Set(['unknown']));
      expect(g.added).toEqual([]);
      // A named model is routed as ever.
      expect(
        (await post(g, '/v1/chat/completions', '{"model":"llama","messages":[]}')).reason,
      ).toBe('queue_full');
      await gateway!.app.close();
      await Promise.all(gateway!.queues.map((q) => q.close()));
      gateway = undefined;
    }
  });

  it('names ten models at most', async () => {
    const models = Array.from({ length: 12 }, (_, i) => `m${i}`);
    const config = `pools:
  - name: a
    models: [${models.slice(0, 6).join(', ')}]
    engines: [{ url: "http://127.0.0.1:1" }]
  - name: b
    models: [${models.slice(6).join(', ')}]
    engines: [{ url: "http://127.0.0.1:2" }]
`;
    const g = await start(
      loadConfig({ SLUICE_CONFIG: '/etc/sluice.yaml', REDIS_URL: server.url }, () => config),
    );
    const res = await post(g, '/v1/completions', '{"prompt":"x"}');
    expect(res.message).toContain(`served here: ${models.slice(0, 10).join(', ')} and 2 more;`);
  });
});
