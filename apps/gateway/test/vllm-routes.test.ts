// vLLM's routes beyond the OpenAI ones, on an edge built as main.ts builds it (auth with
// tenants, error handlers, the completion and operations routes) between real sockets:
// `/tokenize` and `/detokenize` go ungated to the model's engine (a pool's engines in turn,
// each with its own key), `/health` and `/version` are answered here, `/v1/responses` is a
// 404 that says it is not supported, and `/metrics` on the API port needs a key.
import { createHash } from 'node:crypto';
import { once } from 'node:events';
import { readFileSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { loadConfig } from '@sluice/config';
import { gatewayMetrics, Registry } from '@sluice/observability';
import Fastify, { type FastifyInstance, type FastifyReply } from 'fastify';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import type { RequestEnd } from '../src/access-log.ts';
import { installAuth } from '../src/auth.ts';
import { installErrorHandlers } from '../src/errors.ts';
import { ModelCards } from '../src/model-cards.ts';
import { Passthrough } from '../src/passthrough.ts';
import { refusal, refusalBody, refusalHeaders, type Refusal } from '../src/refuse.ts';
import { installRequestId } from '../src/request-id.ts';
import type { ReplyRouter } from '../src/replies.ts';
import { Routing } from '../src/routing.ts';
import { acceptRawJson, completionRoutes } from '../src/routes/completions.ts';
import { opsRoutes } from '../src/routes/ops.ts';

const KEY = 'sk-alpha-vllm-routes-01';
const sha = (key: string) => createHash('sha256').update(key).digest('hex');

interface Received {
  engine: string;
  path: string;
  authorization: string | undefined;
  body: string;
}

/** A vLLM engine's tokenizer routes, recording what each request carried. */
async function fakeEngine(name: string, received: Received[]): Promise<Server> {
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      received.push({
        engine: name,
        path: req.url ?? '',
        authorization: req.headers.authorization,
        body: Buffer.concat(chunks).toString(),
      });
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(
        req.url === '/tokenize'
          ? `{"count":2,"max_model_len":4096,"tokens":[1,2],"engine":"${name}"}`
          : `{"prompt":"hi","engine":"${name}"}`,
      );
    });
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  return server;
}

const urlOf = (s: Server) => `http://127.0.0.1:${(s.address() as AddressInfo).port}`;

const received: Received[] = [];
const ended: RequestEnd[] = [];
const refused: Refusal[] = [];
let servers: Server[] = [];
let app: FastifyInstance;
let metrics: ReturnType<typeof gatewayMetrics>;
let draining = false;

beforeAll(async () => {
  servers = await Promise.all(['e1', 'e2', 'e3', 'pt'].map((name) => fakeEngine(name, received)));
  const [e1, e2, e3, pt] = servers.map(urlOf) as [string, string, string, string];
  // Ports nothing listens on (privileged, unused), as the embeddings test's.
  const [dead1, dead2] = ['http://127.0.0.1:1', 'http://127.0.0.1:2'];
  const yaml = `pools:
  - name: chat
    models: [m]
    engines:
      - { url: "${e1}", apiKey: key-e1 }
      - { url: "${e2}", apiKey: key-e2 }
  - name: half
    models: [h]
    engines:
      - { url: "${dead1}", apiKey: key-dead }
      - { url: "${e3}" }
  - name: gone
    models: [g]
    engines: [{ url: "${dead2}" }]
passthrough:
  - { model: emb, url: "${pt}" }
tenants:
  - name: alpha
    apiKeySha256: [${sha(KEY)}]
`;
  const config = loadConfig({ SLUICE_CONFIG: '/etc/sluice.yaml' }, () => yaml);
  const registry = new Registry();
  metrics = gatewayMetrics(registry);
  const refuse = (reply: FastifyReply, model: string, r: Refusal) => {
    refused.push(r);
    metrics.rejected.inc({ model, reason: r.reason });
    return reply.code(r.status).headers(refusalHeaders(r)).send(refusalBody(r));
  };
  app = Fastify();
  acceptRawJson(app);
  installRequestId(app, Date.now);
  installAuth(app, config.tenants, (reply, r) => refuse(reply, 'unknown', r));
  installErrorHandlers(app, {
    maxBodyBytes: 1024 * 1024,
    requestTimeoutSeconds: 30,
    refuse,
    onRefused: (r) => refused.push(r),
  });
  const routing = new Routing(config);
  await app.register(completionRoutes, {
    replicaId: 'gw',
    limits: config.limits,
    routing,
    // Nothing is queued on these paths: a queue asked for would throw.
    pools: new Map(),
    redisUp: () => false,
    replies: {} as ReplyRouter,
    passthrough: new Passthrough(true),
    metrics,
    now: Date.now,
    heldHooks: () => {
      throw new Error('nothing is held on these paths');
    },
    // As HeldClients.admit: only a pool's requests need Redis.
    admit: (kind) =>
      draining
        ? refusal('shutting_down', 'this gateway replica is shutting down; retry')
        : kind === 'pool'
          ? refusal('redis_unavailable', 'queue unavailable (Redis unreachable)')
          : undefined,
    refuse,
    ended: (end) => void ended.push(end),
  });
  await app.register(opsRoutes, {
    replicaId: 'gw',
    routing,
    cards: new ModelCards(),
    redisUp: () => false,
    pools: new Map(),
    registry,
    draining: () => draining,
    serveMetrics: true,
  });
  await app.listen({ port: 0, host: '127.0.0.1' });
});

afterAll(async () => {
  await app.close();
  for (const s of servers) s.close();
});

beforeEach(() => {
  draining = false;
});

const gateway = () => `http://127.0.0.1:${(app.server.address() as AddressInfo).port}`;
const bearer = { authorization: `Bearer ${KEY}` };

function post(path: string, body: unknown, headers: Record<string, string> = bearer) {
  return fetch(`${gateway()}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify(body),
  });
}

describe('POST /tokenize and /detokenize', () => {
  it("go to the pool's engines in turn, ungated, at the same path, body unchanged, each with its own key", async () => {
    const before = received.length;
    const answers = [];
    for (let i = 0; i < 3; i++) {
      const res = await post('/tokenize', { model: 'm', prompt: 'hello there' });
      expect(res.status).toBe(200);
      answers.push(((await res.json()) as { engine: string }).engine);
    }
    const res = await post('/detokenize', { model: 'm', tokens: [1, 2] });
    expect(res.status).toBe(200);
    expect(await res.json()).toMatchObject({ prompt: 'hi' });
    const got = received.slice(before);
    // Round robin: e1, e2, e1, then e2 for the detokenize.
    expect(answers).toEqual(['e1', 'e2', 'e1']);
    expect(got.map((r) => [r.engine, r.path, r.authorization])).toEqual([
      ['e1', '/tokenize', 'Bearer key-e1'],
      ['e2', '/tokenize', 'Bearer key-e2'],
      ['e1', '/tokenize', 'Bearer key-e1'],
      ['e2', '/detokenize', 'Bearer key-e2'],
    ]);
    expect(got[0]!.body).toBe('{"model":"m","prompt":"hello there"}');
    // Not a completion request: no access-log line, no request metrics; Redis (down here)
    // was never needed.
    expect(ended).toEqual([]);
    expect((await metrics.requests.get()).values).toEqual([]);
  });

  it('go to the next engine when one does not answer, and never send the client key', async () => {
    const before = received.length;
    for (let i = 0; i < 2; i++) {
      const res = await post('/tokenize', { model: 'h', prompt: 'x' });
      expect(res.status).toBe(200);
    }
    // The dead engine's turn and the live one's: both answered by the live one, which has no
    // key of its own and so gets no Authorization (the client's is a Sluice key).
    expect(received.slice(before).map((r) => [r.engine, r.authorization])).toEqual([
      ['e3', undefined],
      ['e3', undefined],
    ]);
  });

  it('answer 503 engine_unreachable when no engine answers, counted among the refusals', async () => {
    const res = await post('/tokenize', { model: 'g', prompt: 'x' });
    expect(res.status).toBe(503);
    expect(res.headers.get('x-sluice-reject-reason')).toBe('engine_unreachable');
    expect((await metrics.rejected.get()).values).toContainEqual(
      expect.objectContaining({ labels: { model: 'g', reason: 'engine_unreachable' }, value: 1 }),
    );
  });

  it("send a pass-through model's request to its backend", async () => {
    const res = await post('/tokenize', { model: 'emb', prompt: 'x' });
    expect(res.status).toBe(200);
    expect(received.at(-1)).toMatchObject({ engine: 'pt', path: '/tokenize' });
    expect(received.at(-1)!.authorization).toBeUndefined();
  });

  it('refuse an unknown model (404), a body without a model (400), and a request without a key (401)', async () => {
    const before = received.length;
    const unknown = await post('/tokenize', { model: 'nobody', prompt: 'x' });
    expect(unknown.status).toBe(404);
    expect(unknown.headers.get('x-sluice-reject-reason')).toBe('model_not_found');
    const noModel = await post('/detokenize', { tokens: [1] });
    expect(noModel.status).toBe(400);
    expect(((await noModel.json()) as { error: { message: string } }).error.message).toMatch(
      /model is required/,
    );
    const noKey = await post('/tokenize', { model: 'm', prompt: 'x' }, {});
    expect(noKey.status).toBe(401);
    expect(noKey.headers.get('x-sluice-reject-reason')).toBe('invalid_api_key');
    expect(received).toHaveLength(before);
  });

  it('are refused shutting_down while the replica drains', async () => {
    draining = true;
    const res = await post('/tokenize', { model: 'm', prompt: 'x' });
    expect(res.status).toBe(503);
    expect(res.headers.get('x-sluice-reject-reason')).toBe('shutting_down');
  });
});

describe('/v1/responses', () => {
  it.each([
    ['POST', '/v1/responses'],
    ['GET', '/v1/responses/resp_123'],
    ['DELETE', '/v1/responses/resp_123'],
  ])('%s %s is a 404 saying the Responses API is not supported', async (method, path) => {
    const res = await fetch(`${gateway()}${path}`, {
      method,
      headers: { ...bearer, ...(method === 'POST' ? { 'content-type': 'application/json' } : {}) },
      ...(method === 'POST' ? { body: '{"model":"m","input":"hi"}' } : {}),
    });
    expect(res.status).toBe(404);
    expect(res.headers.get('x-sluice-reject-reason')).toBe('not_found');
    const { error } = (await res.json()) as { error: { message: string; code: string } };
    expect(error.code).toBe('not_found');
    expect(error.message).toBe(
      'Sluice does not support the Responses API (/v1/responses); use /v1/chat/completions',
    );
  });
});

describe('GET /health and /version', () => {
  it("/health answers vLLM's 200 with an empty body, without a key; 503 while draining", async () => {
    const res = await fetch(`${gateway()}/health`);
    expect(res.status).toBe(200);
    expect(await res.text()).toBe('');
    draining = true;
    const drainingRes = await fetch(`${gateway()}/health`);
    expect(drainingRes.status).toBe(503);
    expect(await drainingRes.text()).toBe('');
    // Liveness is not the balancer's question: /healthz stays 200 through the drain.
    expect((await fetch(`${gateway()}/healthz`)).status).toBe(200);
  });

  it("/version answers Sluice's version (sluice --version's), behind the key", async () => {
    const { version } = JSON.parse(
      readFileSync(new URL('../../../package.json', import.meta.url), 'utf8'),
    ) as { version: string };
    const res = await fetch(`${gateway()}/version`, { headers: bearer });
    expect(res.status).toBe(200);
    expect(await res.json()).toEqual({ version, server: 'sluice' });
    expect((await fetch(`${gateway()}/version`)).status).toBe(401);
  });
});

describe('GET /metrics on the API port, with tenants', () => {
  it('needs a key: it lists every tenant and model', async () => {
    const anonymous = await fetch(`${gateway()}/metrics`);
    expect(anonymous.status).toBe(401);
    expect(anonymous.headers.get('x-sluice-reject-reason')).toBe('invalid_api_key');
    expect(await anonymous.text()).not.toContain('sluice_');
    const keyed = await fetch(`${gateway()}/metrics`, { headers: bearer });
    expect(keyed.status).toBe(200);
    expect(await keyed.text()).toContain('sluice_rejected_total');
  });
});
