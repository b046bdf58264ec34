// CORS as vLLM (Starlette's CORSMiddleware) answers it, on real sockets: first the policy on an
// edge wired like the gateway's (request id, CORS, key check, error handlers; routes that write
// by hand on reply.raw as held requests and refusals do), then the real gateway (startGateway,
// a real redis-server): a preflight without a key while tenants are configured, and a held
// event stream's head carrying Access-Control-Allow-Origin.
import { createHash } from 'node:crypto';
import { loadConfig, type CorsConfig, type SluiceConfig, type TenantConfig } from '@sluice/config';
import { keySpace } from '@sluice/protocol';
import { createRedis, redisReady, type Redis } from '@sluice/redis';
import { eventually, startRedis, type TestRedis } from '@sluice/test/support';
import Fastify, { type FastifyInstance, type FastifyReply } from 'fastify';
import { request } from 'undici';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { installAuth } from '../src/auth.ts';
import { ALL_METHODS, EXPOSED_HEADERS, installCors } from '../src/cors.ts';
import { installErrorHandlers } from '../src/errors.ts';
import { startGateway, type Gateway } from '../src/main.ts';
import { refusal, refusalBody, refusalHeaders, writeRefusal, type Refusal } from '../src/refuse.ts';
import { installRequestId } from '../src/request-id.ts';

const KEY = 'sk-cors-test-0001-0123456789abcd';
const sha = (key: string) => createHash('sha256').update(key).digest('hex');
const tenants: TenantConfig[] = [{ name: 'web', keySha256: [sha(KEY)], weight: 1, maxPriority: 0 }];
const APP = 'https://chat.example.com';
const OTHER = 'https://evil.example';
const VLLM_DEFAULTS: CorsConfig = {
  allowedOrigins: '*',
  allowedMethods: '*',
  allowedHeaders: '*',
  allowCredentials: false,
};

interface Answer {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  body: string;
}

async function call(
  url: string,
  method: 'GET' | 'POST' | 'OPTIONS',
  headers: Record<string, string>,
  body?: string,
): Promise<Answer> {
  const type = body === undefined ? {} : { 'content-type': 'application/json' };
  const res = await request(url, { method, headers: { ...type, ...headers }, body });
  return { status: res.statusCode, headers: res.headers, body: await res.body.text() };
}

const preflightHeaders = (origin: string, extra: Record<string, string> = {}) => ({
  origin,
  'access-control-request-method': 'POST',
  ...extra,
});

describe('on an edge wired like the gateway', () => {
  let app: FastifyInstance | undefined;
  let handled: string[];
  afterEach(async () => {
    await app?.close();
    app = undefined;
  });

  /** Request id, CORS, the key check, the error handlers, and routes answering by hand. */
  async function edge(cors: CorsConfig, configured?: TenantConfig[]): Promise<string> {
    handled = [];
    const refuse = (reply: FastifyReply, _model: string, r: Refusal) =>
      reply.code(r.status).headers(refusalHeaders(r)).send(refusalBody(r));
    app = Fastify();
    installRequestId(app, Date.now);
    installCors(app, cors);
    installAuth(app, configured, (reply, r) => refuse(reply, 'unknown', r));
    installErrorHandlers(app, {
      maxBodyBytes: 1024,
      requestTimeoutSeconds: 30,
      refuse,
      onRefused: () => {},
    });
    // A held request: hijacked, its event stream's head written on the raw response.
    app.post('/v1/chat/completions', (request, reply) => {
      handled.push(request.url);
      reply.hijack();
      reply.raw.writeHead(200, { 'content-type': 'text/event-stream' });
      reply.raw.end('data: [DONE]\n\n');
    });
    // A refusal written by hand (a held request answered 503, a pass-through backend away).
    app.post('/v1/completions', (request, reply) => {
      handled.push(request.url);
      reply.hijack();
      writeRefusal(reply.raw, refusal('queue_full', 'queue full', 2));
    });
    app.get('/v1/models', async (request) => {
      handled.push(request.url);
      return { object: 'list', data: [] };
    });
    return app.listen({ host: '127.0.0.1', port: 0 });
  }

  describe("with vLLM's defaults (any origin, method and header; no credentials)", () => {
    it('answers a preflight at once, 200 OK, without the API key that tenants need', async () => {
      const url = await edge(VLLM_DEFAULTS, tenants);
      const res = await call(
        `${url}/v1/chat/completions`,
        'OPTIONS',
        preflightHeaders(APP, { 'access-control-request-headers': 'authorization,content-type' }),
      );
      expect(res.status).toBe(200);
      expect(res.body).toBe('OK');
      expect(res.headers['content-type']).toBe('text/plain; charset=utf-8');
      expect(res.headers['access-control-allow-origin']).toBe('*');
      expect(res.headers['access-control-allow-methods']).toBe(ALL_METHODS.join(', '));
      // `*` mirrors what the preflight asked for, as Starlette does.
      expect(res.headers['access-control-allow-headers']).toBe('authorization,content-type');
      expect(res.headers['access-control-max-age']).toBe('600');
      expect(res.headers['access-control-allow-credentials']).toBeUndefined();
      expect(res.headers.vary).toBeUndefined();
      expect(res.headers['x-request-id']).toEqual(expect.any(String));
      expect(handled).toEqual([]);
    });

    it('puts the headers on answers written by hand on reply.raw: a held stream, a refusal', async () => {
      const url = await edge(VLLM_DEFAULTS);
      const held = await call(`${url}/v1/chat/completions`, 'POST', { origin: APP }, '{}');
      expect(held.status).toBe(200);
      expect(held.headers['content-type']).toBe('text/event-stream');
      expect(held.headers['access-control-allow-origin']).toBe('*');
      expect(held.headers['access-control-expose-headers']).toBe(EXPOSED_HEADERS.join(', '));
      const refused = await call(`${url}/v1/completions`, 'POST', { origin: APP }, '{}');
      expect(refused.status).toBe(503);
      expect(refused.headers['x-sluice-reject-reason']).toBe('queue_full');
      expect(refused.headers['access-control-allow-origin']).toBe('*');
      // What a script may read of a refusal: why, and when to retry.
      expect(EXPOSED_HEADERS).toEqual(
        expect.arrayContaining(['retry-after', 'x-sluice-reject-reason', 'x-request-id']),
      );
    });

    it("puts them on Fastify's answers too: a 401 from the key check, a 405, a route's JSON", async () => {
      const url = await edge(VLLM_DEFAULTS, tenants);
      const noKey = await call(`${url}/v1/chat/completions`, 'POST', { origin: APP }, '{}');
      expect(noKey.status).toBe(401);
      expect(noKey.headers['access-control-allow-origin']).toBe('*');
      // An OPTIONS without Access-Control-Request-Method is no preflight: the key is asked for.
      const plainOptions = await call(`${url}/v1/chat/completions`, 'OPTIONS', { origin: APP });
      expect(plainOptions.status).toBe(401);
      const auth = { authorization: `Bearer ${KEY}`, origin: APP };
      const models = await call(`${url}/v1/models`, 'GET', auth);
      expect(models.status).toBe(200);
      expect(models.headers['access-control-allow-origin']).toBe('*');
      const wrongMethod = await call(`${url}/v1/models`, 'OPTIONS', auth);
      expect(wrongMethod.status).toBe(405);
      expect(wrongMethod.headers['access-control-allow-origin']).toBe('*');
      expect(handled).toEqual(['/v1/models']);
    });

    it('adds nothing to a request without Origin', async () => {
      const url = await edge(VLLM_DEFAULTS);
      const res = await call(`${url}/v1/chat/completions`, 'POST', {}, '{}');
      expect(Object.keys(res.headers).filter((h) => h.startsWith('access-control-'))).toEqual([]);
      const options = await call(`${url}/v1/chat/completions`, 'OPTIONS', {
        'access-control-request-method': 'POST',
      });
      expect(options.status).toBe(405);
    });
  });

  describe('with listed origins, methods and headers', () => {
    const listed: CorsConfig = {
      allowedOrigins: [APP, 'http://localhost:3000'],
      allowedMethods: ['GET', 'POST'],
      allowedHeaders: ['Authorization', 'X-Sluice-Priority'],
      allowCredentials: false,
    };

    it('echoes a listed origin with Vary: Origin, on a preflight and on the answer', async () => {
      const url = await edge(listed);
      const pre = await call(
        `${url}/v1/chat/completions`,
        'OPTIONS',
        preflightHeaders(APP, { 'access-control-request-headers': 'authorization, Content-Type' }),
      );
      expect(pre.status).toBe(200);
      expect(pre.headers['access-control-allow-origin']).toBe(APP);
      expect(pre.headers.vary).toBe('Origin');
      expect(pre.headers['access-control-allow-methods']).toBe('GET, POST');
      // Starlette lists the safelisted headers and the configured ones, sorted.
      expect(pre.headers['access-control-allow-headers']).toBe(
        'Accept, Accept-Language, Authorization, Content-Language, Content-Type, X-Sluice-Priority',
      );
      const res = await call(`${url}/v1/chat/completions`, 'POST', { origin: APP }, '{}');
      expect(res.headers['access-control-allow-origin']).toBe(APP);
      expect(res.headers.vary).toBe('Origin');
    });

    it('refuses a preflight from another origin: 400 "Disallowed CORS origin", no allow-origin', async () => {
      const url = await edge(listed);
      const res = await call(`${url}/v1/chat/completions`, 'OPTIONS', preflightHeaders(OTHER));
      expect(res.status).toBe(400);
      expect(res.body).toBe('Disallowed CORS origin');
      expect(res.headers['access-control-allow-origin']).toBeUndefined();
      expect(res.headers.vary).toBe('Origin');
      // The request itself is served (the browser withholds the answer): no allow-origin.
      const simple = await call(`${url}/v1/chat/completions`, 'POST', { origin: OTHER }, '{}');
      expect(simple.status).toBe(200);
      expect(simple.headers['access-control-allow-origin']).toBeUndefined();
      expect(handled).toEqual(['/v1/chat/completions']);
    });

    it('names every failure of a preflight: method, headers', async () => {
      const url = await edge(listed);
      const ask = (origin: string, method: string, headers?: string) =>
        call(`${url}/v1/chat/completions`, 'OPTIONS', {
          origin,
          'access-control-request-method': method,
          ...(headers === undefined ? {} : { 'access-control-request-headers': headers }),
        });
      expect((await ask(APP, 'DELETE')).body).toBe('Disallowed CORS method');
      expect((await ask(APP, 'post')).body).toBe('Disallowed CORS method');
      expect((await ask(APP, 'POST', 'x-other')).body).toBe('Disallowed CORS headers');
      expect((await ask(OTHER, 'PUT', 'x-other')).body).toBe(
        'Disallowed CORS origin, method, headers',
      );
      expect((await ask('http://localhost:3000', 'GET', 'x-sluice-priority')).status).toBe(200);
    });

    it('answers no origin at all with none ([])', async () => {
      const url = await edge({ ...VLLM_DEFAULTS, allowedOrigins: [] });
      const res = await call(`${url}/v1/chat/completions`, 'OPTIONS', preflightHeaders(APP));
      expect(res.status).toBe(400);
      expect(res.body).toBe('Disallowed CORS origin');
    });
  });

  describe('with credentials and any origin (Starlette does not refuse it)', () => {
    const credentials: CorsConfig = { ...VLLM_DEFAULTS, allowCredentials: true };

    it('echoes the origin on a preflight, where `*` would not do for a credentialed request', async () => {
      const url = await edge(credentials);
      const res = await call(`${url}/v1/chat/completions`, 'OPTIONS', preflightHeaders(OTHER));
      expect(res.status).toBe(200);
      expect(res.headers['access-control-allow-origin']).toBe(OTHER);
      expect(res.headers['access-control-allow-credentials']).toBe('true');
      expect(res.headers.vary).toBe('Origin');
    });

    it('answers `*` without a cookie and the origin itself with one', async () => {
      const url = await edge(credentials);
      const plain = await call(`${url}/v1/chat/completions`, 'POST', { origin: APP }, '{}');
      expect(plain.headers['access-control-allow-origin']).toBe('*');
      expect(plain.headers['access-control-allow-credentials']).toBe('true');
      expect(plain.headers.vary).toBeUndefined();
      const cookie = { origin: APP, cookie: 'session=1' };
      const withCookie = await call(`${url}/v1/chat/completions`, 'POST', cookie, '{}');
      expect(withCookie.headers['access-control-allow-origin']).toBe(APP);
      expect(withCookie.headers['access-control-allow-credentials']).toBe('true');
      expect(withCookie.headers.vary).toBe('Origin');
    });
  });
});

describe('the gateway (startGateway, a real redis-server)', () => {
  const POOL_YAML = [
    'tenants:',
    '  - name: web',
    `    apiKeys: [${KEY}]`,
    'pools:',
    '  - name: main',
    '    models: [m]',
    '    engines:',
    '      - { url: "http://127.0.0.1:1", name: e }',
    '',
  ].join('\n');
  let server: TestRedis;
  let redis: Redis;
  let gateway: Gateway;

  beforeAll(async () => {
    server = await startRedis();
    redis = createRedis(server.url, { name: 'test', role: 'command' });
    await redisReady(redis);
    // A dispatcher leads the pool (its lease), so a request is queued and held, not refused.
    await redis.set(keySpace('sluice').lease('main'), 'dispatcher');
    const config: SluiceConfig = loadConfig(
      {
        SLUICE_CONFIG: '/etc/sluice.yaml',
        REDIS_URL: server.url,
        HOST: '127.0.0.1',
        PORT: '0',
        LOG_LEVEL: 'silent',
        SSE_HEARTBEAT_SECONDS: '0.05',
        SLUICE_SHUTDOWN_DRAIN_SECONDS: '0',
      },
      () => POOL_YAML,
    );
    gateway = await startGateway(config);
    await eventually(async () => {
      const res = await request(`${gateway.url}/readyz`);
      await res.body.dump();
      return res.statusCode === 200;
    }, 'the gateway to be ready');
  });

  afterAll(async () => {
    await gateway?.close();
    await redis?.quit();
    await server?.stop();
  });

  it("answers the reviewer's preflight 200 without a key, where it was refused", async () => {
    const res = await call(
      `${gateway.url}/v1/chat/completions`,
      'OPTIONS',
      preflightHeaders(APP, { 'access-control-request-headers': 'authorization,content-type' }),
    );
    expect(res.status).toBe(200);
    expect(res.headers['access-control-allow-origin']).toBe('*');
    expect(res.headers['access-control-allow-methods']).toContain('POST');
    expect(res.headers['access-control-allow-headers']).toBe('authorization,content-type');
  });

  it('sends the header with a held stream (hijacked, written on reply.raw)', async () => {
    const controller = new AbortController();
    const res = await request(`${gateway.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { origin: APP, authorization: `Bearer ${KEY}`, 'content-type': 'application/json' },
      body: JSON.stringify({
        model: 'm',
        stream: true,
        messages: [{ role: 'user', content: 'hi' }],
      }),
      signal: controller.signal,
    });
    // The head goes out with the first keep-alive while the job waits in the queue.
    expect(res.statusCode).toBe(200);
    expect(res.headers['content-type']).toMatch(/^text\/event-stream/);
    expect(res.headers['access-control-allow-origin']).toBe('*');
    expect(res.headers['access-control-expose-headers']).toBe(EXPOSED_HEADERS.join(', '));
    controller.abort();
    await res.body.text().catch(() => {});
  });

  it("sends it with a refusal, the key check's and the route's, and with /metrics", async () => {
    const noKey = await call(`${gateway.url}/v1/chat/completions`, 'POST', { origin: APP }, '{}');
    expect(noKey.status).toBe(401);
    expect(noKey.headers['access-control-allow-origin']).toBe('*');
    const auth = { origin: APP, authorization: `Bearer ${KEY}` };
    const unknown = await call(
      `${gateway.url}/v1/chat/completions`,
      'POST',
      auth,
      JSON.stringify({ model: 'nobody', messages: [] }),
    );
    expect(unknown.status).toBe(404);
    expect(unknown.headers['access-control-allow-origin']).toBe('*');
    const metrics = await call(`${gateway.url}/metrics`, 'GET', auth);
    expect(metrics.status).toBe(200);
    expect(metrics.headers['access-control-allow-origin']).toBe('*');
  });
});
