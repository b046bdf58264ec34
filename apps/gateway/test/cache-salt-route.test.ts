// The completion routes with tenants: the body a gated job carries and the body a pass-through
// backend gets have the tenant's cache_salt as their last member, whatever the client sent;
// the tokenizer routes and a gateway without salts (no tenants, or SLUICE_TENANT_CACHE_SALT=off)
// pass the client's bytes unchanged. A real redis-server behind PoolQueue, a real Fastify app.
import type { ServerResponse } from 'node:http';
import { loadConfig, type SluiceConfig } from '@sluice/config';
import { gatewayMetrics, Registry } from '@sluice/observability';
import { keySpace, type JobPayload } from '@sluice/protocol';
import { createRedis, redisReady, type Redis } from '@sluice/redis';
import { startRedis, type TestRedis } from '@sluice/test/support';
import Fastify, { type FastifyInstance } from 'fastify';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { installAuth } from '../src/auth.ts';
import { cacheSaltsFor, tenantCacheSalt } from '../src/cache-salt.ts';
import { heldHooks } from '../src/held-hooks.ts';
import type { Passthrough } from '../src/passthrough.ts';
import { PoolQueue } from '../src/pool-queue.ts';
import { refusalBody, refusalHeaders } from '../src/refuse.ts';
import { ReplyRouter } from '../src/replies.ts';
import { installRequestId } from '../src/request-id.ts';
import { Routing } from '../src/routing.ts';
import { acceptRawJson, completionRoutes } from '../src/routes/completions.ts';

const keys = keySpace('sluice');
const ALPHA_KEY = 'sk-alpha-3b9d-0123456789abcdef01';
const BETA_KEY = 'sk-beta-71e0-0123456789abcdef012';

let server: TestRedis;
let redis: Redis;
let bull: Redis;
let replies: ReplyRouter;

beforeAll(async () => {
  server = await startRedis();
  redis = createRedis(server.url, { name: 'cmd', role: 'command' });
  bull = createRedis(server.url, { name: 'bull', role: 'bullmq' });
  await Promise.all([redisReady(redis), redisReady(bull)]);
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

const yaml = [
  'pools:',
  '  - name: p',
  '    models: [m]',
  '    engines:',
  '      - { url: "http://127.0.0.1:1" }',
  'passthrough:',
  '  - { model: pt, url: "http://127.0.0.1:2" }',
  'tenants:',
  '  - name: alpha',
  `    apiKeys: [${ALPHA_KEY}]`,
  '  - name: beta',
  `    apiKeys: [${BETA_KEY}]`,
  '',
].join('\n');

function configWith(env: Record<string, string> = {}): SluiceConfig {
  return loadConfig({ SLUICE_CONFIG: '/sluice.yaml', REDIS_URL: server.url, ...env }, () => yaml);
}

interface Started {
  app: FastifyInstance;
  queue: PoolQueue;
  /** Bodies of the jobs added, as the dispatcher would read them. */
  jobs: Buffer[];
  /** Bodies the pass-through backend (and the tokenizer routes' engines) got, by path. */
  forwarded: [path: string, body: Buffer][];
}

let started: Started | undefined;
afterEach(async () => {
  await started?.app.close();
  await started?.queue.close();
  started = undefined;
});

async function start(config: SluiceConfig): Promise<Started> {
  await redis.flushall();
  const pool = config.pools[0]!;
  await redis.set(keys.lease(pool.name), 'dispatcher');
  const queue = new PoolQueue(pool, keys, redis, bull, config.limits.maxPriority, Date.now);
  const jobs: Buffer[] = [];
  const forwarded: [string, Buffer][] = [];
  // The add answers queue_full: the job's body is what the test needs, not a run.
  queue.add = (_jobId, payload: JobPayload, _level, _tenant, raw) => {
    jobs.push(payload.bodyBase64 !== undefined ? Buffer.from(payload.bodyBase64, 'base64') : raw!);
    return Promise.resolve('queue_full');
  };
  const passthrough = {
    forward: (
      _target: unknown,
      path: string,
      _headers: unknown,
      body: Buffer,
      res: ServerResponse,
    ) => {
      forwarded.push([path, body]);
      res.writeHead(200, { 'content-type': 'application/json' }).end('{}');
      return Promise.resolve({ status: 200 });
    },
  } as unknown as Passthrough;
  const metrics = gatewayMetrics(new Registry());
  const app = Fastify({ logger: false });
  acceptRawJson(app);
  installRequestId(app, Date.now);
  installAuth(app, config.tenants, (reply, r) => reply.code(r.status).send(refusalBody(r)));
  await app.register(completionRoutes, {
    replicaId: 'gw',
    limits: config.limits,
    routing: new Routing(config),
    pools: new Map([[pool.name, queue]]),
    redisUp: () => true,
    replies,
    passthrough,
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
    refuse: (reply, _model, r) =>
      reply.code(r.status).headers(refusalHeaders(r)).send(refusalBody(r)),
    ended: () => {},
    cacheSalts: cacheSaltsFor(config),
  });
  await app.listen({ port: 0, host: '127.0.0.1' });
  started = { app, queue, jobs, forwarded };
  return started;
}

async function post(app: FastifyInstance, path: string, key: string, body: string) {
  const { port } = app.server.address() as { port: number };
  const res = await fetch(`http://127.0.0.1:${port}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${key}` },
    body,
  });
  await res.text();
  return res.status;
}

const saltOf = (body: Buffer) =>
  (JSON.parse(body.toString('utf8')) as { cache_salt?: unknown }).cache_salt;

describe('completion routes with tenants', () => {
  const alphaSalt = () => tenantCacheSalt(configWith().tenants![0]!);
  const betaSalt = () => tenantCacheSalt(configWith().tenants![1]!);

  it("put the tenant's salt into every gated job, over the client's own", async () => {
    const { app, jobs } = await start(configWith());
    const chat = JSON.stringify({ model: 'm', messages: [{ role: 'user', content: 'hi' }] });
    const forged = `{"model":"m","prompt":"hi","cache_salt":"${betaSalt()}"}`;
    expect(await post(app, '/v1/chat/completions', ALPHA_KEY, chat)).toBe(503);
    expect(await post(app, '/v1/completions', ALPHA_KEY, forged)).toBe(503);
    expect(await post(app, '/v1/completions', BETA_KEY, forged)).toBe(503);
    expect(jobs.map(saltOf)).toStrictEqual([alphaSalt(), alphaSalt(), betaSalt()]);
    expect(alphaSalt()).not.toBe(betaSalt());
    // Appended, nothing else changed.
    expect(jobs[1]!.toString()).toBe(forged.slice(0, -1) + `,"cache_salt":"${alphaSalt()}"}`);
  });

  it('salts a body large enough to travel in a key of its own the same way', async () => {
    const config = configWith({ SLUICE_BODY_KEY_MIN_BYTES: '0' });
    const { app, jobs } = await start(config);
    expect(await post(app, '/v1/completions', BETA_KEY, '{ "model": "m", "prompt": "x" }\n')).toBe(
      503,
    );
    expect(jobs[0]!.toString()).toBe(
      `{ "model": "m", "prompt": "x" ,"cache_salt":"${betaSalt()}"}\n`,
    );
  });

  it('put it into pass-through completions, not into the tokenizer routes', async () => {
    const { app, forwarded } = await start(configWith());
    const body = '{"model":"pt","prompt":"hi"}';
    expect(await post(app, '/v1/completions', ALPHA_KEY, body)).toBe(200);
    expect(await post(app, '/tokenize', ALPHA_KEY, body)).toBe(200);
    expect(await post(app, '/v1/embeddings', ALPHA_KEY, '{"model":"pt","input":"x"}')).toBe(200);
    expect(forwarded.map(([path, b]) => [path, saltOf(b)])).toStrictEqual([
      ['/v1/completions', alphaSalt()],
      ['/tokenize', undefined],
      ['/v1/embeddings', undefined],
    ]);
  });

  it("leave the client's body as it was with SLUICE_TENANT_CACHE_SALT=off", async () => {
    const { app, jobs, forwarded } = await start(configWith({ SLUICE_TENANT_CACHE_SALT: 'off' }));
    const gated = '{"model":"m","prompt":"hi","cache_salt":"mine"}';
    const passed = '{"model":"pt","prompt":"hi"}';
    expect(await post(app, '/v1/completions', ALPHA_KEY, gated)).toBe(503);
    expect(await post(app, '/v1/completions', ALPHA_KEY, passed)).toBe(200);
    expect(jobs.map(String)).toStrictEqual([gated]);
    expect(forwarded.map(([, b]) => String(b))).toStrictEqual([passed]);
  });
});
