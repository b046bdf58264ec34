// What the engine learns of the client's request through a real gateway and dispatcher (real
// Redis): the client's X-Request-Id, its W3C trace context and X-data-parallel-rank reach the
// engine as they would reach vLLM sent direct, so the completion id is the one the client
// correlates by. The engine is a small HTTP server that answers as vLLM does and keeps the
// headers it got (the engine simulator keeps none): it names the completion as vLLM's
// `_base_request_id` does (vllm/entrypoints/openai/engine/serving.py), `chatcmpl-<X-Request-Id>`.
import { once } from 'node:events';
import { createServer, type IncomingHttpHeaders, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  startDispatcher,
  startGateway,
  startRedis,
  untilReady,
  type SluiceProcess,
  type TestRedis,
} from '../support/index.ts';

let redis: TestRedis;
let engine: Server;
let dispatcher: SluiceProcess;
let gateway: SluiceProcess;
const received: IncomingHttpHeaders[] = [];

beforeAll(async () => {
  redis = await startRedis();
  engine = createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      if (req.method !== 'POST' || req.url !== '/v1/chat/completions') {
        res.writeHead(404).end();
        return;
      }
      received.push(req.headers);
      const id = `chatcmpl-${String(req.headers['x-request-id'] ?? 'random')}`;
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ id, object: 'chat.completion', model: 'm', choices: [] }));
    });
  });
  engine.listen(0, '127.0.0.1');
  await once(engine, 'listening');
  const env = {
    REDIS_URL: redis.url,
    VLLM_URL: `http://127.0.0.1:${(engine.address() as AddressInfo).port}`,
    VLLM_MODEL: 'm',
  };
  dispatcher = await startDispatcher(env);
  gateway = await startGateway(env);
  await untilReady(gateway);
}, 90_000);

afterAll(async () => {
  await gateway?.stop();
  await dispatcher?.stop();
  engine?.close();
  await redis?.stop();
});

const chat = (headers: Record<string, string>) =>
  fetch(`${gateway.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify({ model: 'm', messages: [{ role: 'user', content: 'hi' }] }),
  });

describe('engine request headers', () => {
  it("gives the engine the client's request id, trace context and data-parallel rank", async () => {
    const traceparent = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01';
    const res = await chat({
      'x-request-id': 'client-req-42',
      traceparent,
      tracestate: 'congo=t61rcWkgMzE',
      'x-data-parallel-rank': '1',
    });
    expect(res.status).toBe(200);
    expect(res.headers.get('x-request-id')).toBe('client-req-42');
    expect(((await res.json()) as { id: string }).id).toBe('chatcmpl-client-req-42');
    expect(received.at(-1)).toMatchObject({
      'x-request-id': 'client-req-42',
      traceparent,
      tracestate: 'congo=t61rcWkgMzE',
      'x-data-parallel-rank': '1',
    });
  });

  it('names the completion after the id the gateway answers with when the client sent none', async () => {
    const res = await chat({ traceparent: 'not-a-traceparent', 'x-data-parallel-rank': 'x' });
    expect(res.status).toBe(200);
    const id = res.headers.get('x-request-id')!;
    expect(id).toMatch(/^[0-9a-f-]{36}$/);
    expect(((await res.json()) as { id: string }).id).toBe(`chatcmpl-${id}`);
    const headers = received.at(-1)!;
    expect(headers['x-request-id']).toBe(id);
    expect(headers).not.toHaveProperty('traceparent');
    expect(headers).not.toHaveProperty('x-data-parallel-rank');
  });
});
