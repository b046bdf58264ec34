// POST /v1/embeddings: only pass-through backends answer it. A real Fastify app with the
// completion routes, a real Passthrough and a backend that records what it got; a pool's model
// is refused as vLLM refuses a model without the Embeddings API.
import { once } from 'node:events';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { loadConfig } from '@sluice/config';
import { gatewayMetrics, Registry } from '@sluice/observability';
import Fastify, { type FastifyInstance } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RequestEnd } from '../src/access-log.ts';
import { Passthrough } from '../src/passthrough.ts';
import { refusalBody, refusalHeaders } from '../src/refuse.ts';
import { installRequestId } from '../src/request-id.ts';
import { Routing } from '../src/routing.ts';
import { acceptRawJson, completionRoutes } from '../src/routes/completions.ts';
import type { ReplyRouter } from '../src/replies.ts';

let backend: Server;
let metrics: ReturnType<typeof gatewayMetrics>;
let app: FastifyInstance;
const received: { path: string; body: string }[] = [];
const ended: RequestEnd[] = [];

beforeAll(async () => {
  backend = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      received.push({ path: req.url ?? '', body: Buffer.concat(chunks).toString() });
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end('{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.5]}]}');
    });
  });
  backend.listen(0, '127.0.0.1');
  await once(backend, 'listening');
  const backendUrl = `http://127.0.0.1:${(backend.address() as AddressInfo).port}`;
  const yaml = `pools:
  - name: chat
    models: [m]
    engines: [{ url: "http://127.0.0.1:1" }]
passthrough:
  - { model: emb, url: "${backendUrl}" }
  - { model: gone, url: "http://127.0.0.1:2" }
`;
  const config = loadConfig({ SLUICE_CONFIG: '/etc/sluice.yaml' }, () => yaml);
  metrics = gatewayMetrics(new Registry());
  app = Fastify();
  acceptRawJson(app);
  installRequestId(app, Date.now);
  await app.register(completionRoutes, {
    replicaId: 'gw',
    limits: config.limits,
    routing: new Routing(config),
    // Nothing here is queued: a pool's model is refused before any queue is asked.
    pools: new Map(),
    redisUp: () => true,
    replies: {} as ReplyRouter,
    passthrough: new Passthrough(false),
    metrics,
    now: Date.now,
    heldHooks: () => {
      throw new Error('nothing is held on this path');
    },
    admit: () => undefined,
    refuse: (reply, _model, r) =>
      reply.code(r.status).headers(refusalHeaders(r)).send(refusalBody(r)),
    ended: (end) => void ended.push(end),
  });
  await app.listen({ port: 0, host: '127.0.0.1' });
});

afterAll(async () => {
  await app.close();
  backend.close();
});

function embed(model: string) {
  const port = (app.server.address() as AddressInfo).port;
  return fetch(`http://127.0.0.1:${port}/v1/embeddings`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model, input: ['a sentence'], encoding_format: 'float' }),
  });
}

describe('POST /v1/embeddings', () => {
  it("goes to the model's pass-through backend at the same path, body unchanged", async () => {
    const res = await embed('emb');
    expect(res.status).toBe(200);
    expect(await res.json()).toMatchObject({ object: 'list', data: [{ embedding: [0.5] }] });
    expect(received.at(-1)).toEqual({
      path: '/v1/embeddings',
      body: '{"model":"emb","input":["a sentence"],"encoding_format":"float"}',
    });
    expect(ended.at(-1)).toMatchObject({ model: 'emb', passthrough: true, status: 200 });
  });

  it("refuses a pool's model with 400, as vLLM refuses a model without the API", async () => {
    const before = received.length;
    const res = await embed('m');
    expect(res.status).toBe(400);
    expect(res.headers.get('x-sluice-reject-reason')).toBe('bad_request');
    const { error } = (await res.json()) as { error: { message: string } };
    expect(error.message).toMatch(/^The model `m` does not support the Embeddings API/);
    expect(error.message).toContain('pool chat');
    expect(received).toHaveLength(before);
  });

  it('answers 404 model_not_found for a model nobody serves', async () => {
    const res = await embed('nobody');
    expect(res.status).toBe(404);
    expect(res.headers.get('x-sluice-reject-reason')).toBe('model_not_found');
  });

  it('counts a pass-through request Sluice ended among the refusals, by its reason', async () => {
    const res = await embed('gone');
    expect(res.status).toBe(503);
    expect(res.headers.get('x-sluice-reject-reason')).toBe('engine_unreachable');
    const rejected = await metrics.rejected.get();
    expect(rejected.values).toContainEqual(
      expect.objectContaining({
        labels: { model: 'gone', reason: 'engine_unreachable' },
        value: 1,
      }),
    );
  });
});
