// vLLM's own routes through a real gateway process (real Redis, keyed tenants, no dispatcher,
// /metrics on the API port): `/health` and `/version` are answered by the gateway, `/tokenize`
// and `/detokenize` reach the pool's engine ungated (no dispatcher runs, so a queued request
// could not be served) with the engine's own key, `/v1/responses` is a 404 that says it is
// not supported, and `/metrics` on the API port needs a tenant key. The engine is a small
// HTTP server answering vLLM's tokenizer routes (the engine simulator has none).
import { once } from 'node:events';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, type IncomingHttpHeaders, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  answer,
  repoRoot,
  startGateway,
  startRedis,
  type SluiceProcess,
  type TestRedis,
} from '../support/index.ts';

const KEY = 'sk-alpha-vllm-compat-3c1d-012345';
const ENGINE_KEY = 'engine-secret-vllm-compat';

let redis: TestRedis;
let engine: Server;
let gateway: SluiceProcess;
let dir: string;
const received: { path: string; headers: IncomingHttpHeaders; body: string }[] = [];

beforeAll(async () => {
  redis = await startRedis();
  engine = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const path = req.url ?? '';
      if (req.method !== 'POST' || (path !== '/tokenize' && path !== '/detokenize')) {
        res.writeHead(404).end();
        return;
      }
      received.push({ path, headers: req.headers, body: Buffer.concat(chunks).toString() });
      res.writeHead(200, { 'content-type': 'application/json' });
      // vLLM's TokenizeResponse and DetokenizeResponse (vllm/entrypoints/serve/tokenize/protocol.py).
      res.end(
        path === '/tokenize'
          ? '{"count":3,"max_model_len":4096,"tokens":[101,102,103],"token_strs":null}'
          : '{"prompt":"hello"}',
      );
    });
  });
  engine.listen(0, '127.0.0.1');
  await once(engine, 'listening');
  const engineUrl = `http://127.0.0.1:${(engine.address() as AddressInfo).port}`;
  dir = mkdtempSync(join(tmpdir(), 'sluice-vllm-compat-'));
  const config = join(dir, 'sluice.yaml');
  writeFileSync(
    config,
    [
      'pools:',
      '  - name: p',
      '    models: [m]',
      '    engines:',
      `      - { url: "${engineUrl}", apiKey: ${ENGINE_KEY} }`,
      'tenants:',
      '  - name: alpha',
      `    apiKeys: [${KEY}]`,
      '',
    ].join('\n'),
  );
  gateway = await startGateway({ REDIS_URL: redis.url, SLUICE_CONFIG: config });
}, 60_000);

afterAll(async () => {
  await gateway?.stop();
  engine?.close();
  await redis?.stop();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

const bearer = { authorization: `Bearer ${KEY}` };
const post = (path: string, body: unknown, headers: Record<string, string> = bearer) =>
  fetch(`${gateway.url}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify(body),
  });

describe("vLLM's routes through a gateway", () => {
  it('GET /health: 200 with an empty body, without a key', async () => {
    const res = await fetch(`${gateway.url}/health`);
    expect(res.status).toBe(200);
    expect(await res.text()).toBe('');
  });

  it("GET /version: Sluice's version, with a key", async () => {
    const { version } = JSON.parse(readFileSync(`${repoRoot}package.json`, 'utf8')) as {
      version: string;
    };
    const res = await fetch(`${gateway.url}/version`, { headers: bearer });
    expect(res.status).toBe(200);
    expect(await res.json()).toEqual({ version, server: 'sluice' });
    expect((await fetch(`${gateway.url}/version`)).status).toBe(401);
  });

  it("POST /tokenize and /detokenize reach the pool's engine ungated, with the engine's key", async () => {
    const tokenize = await answer(post('/tokenize', { model: 'm', prompt: 'hello there' }));
    expect(tokenize.status).toBe(200);
    expect(JSON.parse(tokenize.body)).toMatchObject({ count: 3, tokens: [101, 102, 103] });
    const detokenize = await answer(post('/detokenize', { model: 'm', tokens: [101, 102] }));
    expect(detokenize.status).toBe(200);
    expect(JSON.parse(detokenize.body)).toEqual({ prompt: 'hello' });
    expect(
      received.map((r) => [r.path, r.headers.authorization, r.headers['x-request-id'] !== '']),
    ).toEqual([
      ['/tokenize', `Bearer ${ENGINE_KEY}`, true],
      ['/detokenize', `Bearer ${ENGINE_KEY}`, true],
    ]);
    expect(received[0]!.body).toBe('{"model":"m","prompt":"hello there"}');
    // Without a key nothing reaches the engine.
    const anonymous = await answer(post('/tokenize', { model: 'm', prompt: 'x' }, {}));
    expect(anonymous.status).toBe(401);
    expect(received).toHaveLength(2);
  });

  it('POST /v1/responses: 404 saying the Responses API is not supported', async () => {
    const res = await answer(post('/v1/responses', { model: 'm', input: 'hi' }));
    expect(res.status).toBe(404);
    expect(res.reason).toBe('not_found');
    expect(JSON.parse(res.body).error.message).toBe(
      'Sluice does not support the Responses API (/v1/responses); use /v1/chat/completions',
    );
  });

  it('GET /metrics on the API port needs a tenant key, and the gateway says so at start', async () => {
    const anonymous = await answer(fetch(`${gateway.url}/metrics`));
    expect(anonymous.status).toBe(401);
    expect(anonymous.reason).toBe('invalid_api_key');
    expect(anonymous.body).not.toContain('alpha');
    const keyed = await fetch(`${gateway.url}/metrics`, { headers: bearer });
    expect(keyed.status).toBe(200);
    expect(await keyed.text()).toContain(
      'sluice_rejected_total{model="unknown",reason="invalid_api_key"}',
    );
    expect(
      gateway.process.output.some(
        (l) => l.includes('"level":40') && l.includes('set GATEWAY_METRICS_PORT'),
      ),
    ).toBe(true);
  });
});
