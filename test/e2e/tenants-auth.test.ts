// Keys and tenants end to end: real Redis, gateway, dispatcher and two engine simulators that
// want keys of their own (a gated engine with `--api-key`, and a pass-through backend with
// another). Clients without a valid key get 401 and reach nothing; valid keys are served, so
// the engines got their own keys and never the client's (they would have answered 401); the
// operations paths stay open, `/metrics` moves to GATEWAY_METRICS_PORT; and no process logs a
// key, a prompt or a completion, even at LOG_LEVEL=trace.
import { createHash } from 'node:crypto';
import { once } from 'node:events';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  answer,
  startDispatcher,
  startEngineSim,
  startGateway,
  startRedis,
  type SluiceProcess,
  type TestEngineSim,
  type TestRedis,
  untilReady,
} from '../support/index.ts';

const ALPHA_KEY = 'sk-alpha-7f3c9e21d4b8a605-012345';
const BETA_KEY = 'sk-beta-1b6e0d94c2a7f358-0123456';
const ENGINE_KEY = 'engine-secret';
const BACKEND_KEY = 'backend-secret-5d21';
// Text that exists only in this test's requests, and so may appear in no log line.
const MARKER = 'PROMPT-MARKER-4b1f8e0c-tenants';
const MAX_BODY_BYTES = 1_048_576;

let redis: TestRedis;
let engine: TestEngineSim;
let backend: TestEngineSim;
let dispatcher: SluiceProcess;
let gateway: SluiceProcess;
let metricsUrl: string;
let dir: string;
/** The completion texts the engine wrote for this test's requests. */
const completions: string[] = [];

const sha = (key: string) => createHash('sha256').update(key).digest('hex');
const trace = { LOG_LEVEL: 'trace' };

beforeAll(async () => {
  redis = await startRedis();
  const simArgs = (model: string, key: string) => [
    ...['--profile', 'instant', '--model', model, '--api-key', key],
  ];
  [engine, backend] = await Promise.all([
    startEngineSim(simArgs('m', ENGINE_KEY), trace),
    startEngineSim(simArgs('pt', BACKEND_KEY), trace),
  ]);
  dir = mkdtempSync(join(tmpdir(), 'sluice-tenants-'));
  const config = join(dir, 'sluice.yaml');
  writeFileSync(
    config,
    [
      'pools:',
      '  - name: p',
      '    models: [m]',
      '    engines:',
      `      - { url: "${engine.url}", maxInflight: 2, apiKey: ${ENGINE_KEY} }`,
      'passthrough:',
      `  - { model: pt, url: "${backend.url}", apiKey: ${BACKEND_KEY} }`,
      'tenants:',
      '  - name: alpha',
      `    apiKeys: [${ALPHA_KEY}]`,
      '  - name: beta',
      `    apiKeySha256: [${sha(BETA_KEY)}]`,
      '',
    ].join('\n'),
  );
  const env = { ...trace, REDIS_URL: redis.url, SLUICE_CONFIG: config };
  dispatcher = await startDispatcher(env);
  gateway = await startGateway({
    ...env,
    GATEWAY_METRICS_PORT: '0',
    MAX_BODY_BYTES: String(MAX_BODY_BYTES),
  });
  metricsUrl = (await gateway.process.waitForLine(/"metricsUrl":"([^"]+)"/))[1]!;
  await untilReady(gateway);
}, 60_000);

afterAll(async () => {
  await gateway?.stop();
  await dispatcher?.stop();
  await Promise.all([engine?.stop(), backend?.stop()]);
  await redis?.stop();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

/** A chat request whose system message carries the marker, so the engine shows it arrived. */
function ask(model: string, headers: Record<string, string>, extra: Record<string, unknown> = {}) {
  return answer(
    fetch(`${gateway.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', ...headers },
      body: JSON.stringify({
        model,
        messages: [
          { role: 'system', content: MARKER },
          { role: 'user', content: `${MARKER} user` },
        ],
        max_tokens: 24,
        ignore_eos: true,
        ...extra,
      }),
    }),
  );
}

const bearer = (key: string) => ({ authorization: `Bearer ${key}` });
/** `sluice_rejected_total{reason="invalid_api_key"}` on the gateway's metrics port. */
async function invalidKeyRefusals(): Promise<number> {
  const text = await (await fetch(`${metricsUrl}/metrics`)).text();
  return text
    .split('\n')
    .filter((l) => l.startsWith('sluice_rejected_total{') && l.includes('reason="invalid_api_key"'))
    .reduce((sum, l) => sum + Number(l.split(' ').pop()), 0);
}
const engineCounts = async (sim: TestEngineSim) => {
  const state = await sim.state();
  return { received: state['receivedTotal'], unauthorized: state['unauthorizedTotal'] };
};

/** The head of a completion request without a key, declaring `length` bytes of body. */
const requestHead = (length: number) =>
  'POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n' +
  `content-length: ${length}\r\n\r\n`;

/** A bare connection to the gateway; `received(pattern)` waits for what it has read to match. */
async function rawClient() {
  const { port } = new URL(gateway.url);
  const socket = connect(Number(port), '127.0.0.1');
  await once(socket, 'connect');
  // Not `once`, which rejects on the EPIPE or reset that may come first.
  const closed = new Promise((resolve) => socket.once('close', resolve));
  socket.on('error', () => {});
  let text = '';
  const waiting: Array<{ pattern: RegExp; resolve: (t: string) => void }> = [];
  socket.on('data', (chunk: Buffer) => {
    text += chunk.toString('latin1');
    for (const w of waiting.splice(0)) {
      if (w.pattern.test(text)) w.resolve(text);
      else waiting.push(w);
    }
  });
  const received = (pattern: RegExp) =>
    new Promise<string>((resolve) => {
      if (pattern.test(text)) resolve(text);
      else waiting.push({ pattern, resolve });
    });
  return { socket, closed, received };
}

describe('API keys at the gateway', () => {
  it('answers a missing or unknown key with 401 invalid_api_key, and nothing reaches an engine', async () => {
    const before = await Promise.all([engineCounts(engine), engineCounts(backend)]);
    const rejectedBefore = await invalidKeyRefusals();

    const missing = await ask('m', {});
    const unknown = await ask('m', bearer('sk-nobody-0000'));
    const wrongScheme = await ask('m', { authorization: `Basic ${ALPHA_KEY}` });
    const toBackend = await ask('pt', bearer('sk-nobody-0000'));
    const models = await answer(fetch(`${gateway.url}/v1/models`));
    const unknownPath = await answer(fetch(`${gateway.url}/v1/embeddings`, { method: 'POST' }));
    const refused = [missing, unknown, wrongScheme, toBackend, models, unknownPath];
    for (const res of refused) {
      expect(res.status).toBe(401);
      expect(res.reason).toBe('invalid_api_key');
      const body = JSON.parse(res.body) as { error: Record<string, unknown> };
      expect(body.error).toMatchObject({ type: 'invalid_request_error', code: 'invalid_api_key' });
      expect(res.body).not.toContain('sk-');
    }
    expect(JSON.parse(missing.body).error.message).toMatch(/^You didn't provide an API key\./);
    expect(JSON.parse(unknown.body).error.message).toBe('Incorrect API key provided.');

    // Nothing was sent on: neither engine saw a request, not even one it refused.
    expect(await Promise.all([engineCounts(engine), engineCounts(backend)])).toEqual(before);
    expect(await invalidKeyRefusals()).toBe(rejectedBefore + refused.length);
  });

  it('cuts the connection of a 401 whose body keeps coming once MAX_BODY_BYTES of it are dropped', async () => {
    const { socket, closed } = await rawClient();
    // 100 GB declared; the client keeps sending until the gateway closes.
    socket.write(requestHead(100_000_000_000));
    const chunk = Buffer.alloc(64 * 1024, 0x20);
    let sent = 0;
    const pump = async () => {
      for (; !socket.destroyed && socket.writable; sent += chunk.length)
        // EPIPE once the gateway has closed: `once` rejects on 'error', and the loop ends.
        if (!socket.write(chunk))
          await Promise.race([once(socket, 'drain').catch(() => {}), closed]);
    };
    await Promise.all([pump(), closed]);
    // Dropped up to the bound (plus what the sockets' buffers hold), then cut, where Node would
    // read all 100 GB. Whether this client read its 401 before the reset is the machine's
    // timing: one that sends past the bound was not going to be served anyway.
    expect(sent).toBeLessThan(MAX_BODY_BYTES + 32 * 1024 * 1024);
  });

  it('lets a client with a wrong key send its whole body, read its 401 and go on on the same connection', async () => {
    const { socket, received } = await rawClient();
    const length = MAX_BODY_BYTES / 2;
    socket.write(requestHead(length));
    const chunk = Buffer.alloc(64 * 1024, 0x20);
    for (let sent = 0; sent < length; sent += chunk.length)
      if (!socket.write(chunk.subarray(0, Math.min(chunk.length, length - sent))))
        await once(socket, 'drain');
    await received(/invalid_api_key/);
    socket.write('GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n');
    const text = await received(/"status":"ok"/);
    expect(text).toMatch(/^HTTP\/1\.1 401 /);
    expect(text).toMatch(/^HTTP\/1\.1 401 [\s\S]*HTTP\/1\.1 200 /);
    socket.destroy();
  });

  it('answers a URL that does not decode as every refusal, in the OpenAI error shape', async () => {
    const res = await answer(
      fetch(`${gateway.url}/v1/chat/completions%ZZ`, {
        method: 'POST',
        headers: bearer(ALPHA_KEY),
      }),
    );
    expect([res.status, res.reason]).toEqual([400, 'bad_request']);
    expect(JSON.parse(res.body).error).toMatchObject({
      code: 'bad_request',
      message: expect.stringMatching(/^malformed URL "\/v1\/chat\/completions%ZZ"/),
    });
  });

  it("serves valid keys (plain and by digest): the engine got its own key, not the client's", async () => {
    const before = await engineCounts(engine);
    const alpha = await ask('m', bearer(ALPHA_KEY));
    const beta = await ask('m', { authorization: `bearer ${BETA_KEY}` }, { stream: true });
    expect(alpha.status).toBe(200);
    expect(beta.status).toBe(200);
    const text = JSON.parse(alpha.body).choices[0].message.content as string;
    expect(text.split(' ').length).toBe(24);
    completions.push(text);
    expect(beta.body.endsWith('data: [DONE]\n\n')).toBe(true);
    const streamed = beta.body
      .split('\n\n')
      .filter((e) => e.startsWith('data: {'))
      .map((e) => JSON.parse(e.slice(6)).choices?.[0]?.delta?.content ?? '')
      .join('');
    expect(streamed.split(' ').length).toBe(24);
    completions.push(streamed);

    // Both reached the engine and none was refused there: it would refuse the client's key.
    // A valid key with a body the gateway refuses, and a model nobody serves: answered at the
    // edge (the error paths must not log the prompt either).
    const broken = await answer(
      fetch(`${gateway.url}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', ...bearer(ALPHA_KEY) },
        body: `{"model":"m","messages":[{"role":"user","content":"${MARKER}"}`,
      }),
    );
    expect(broken.status).toBe(400);
    expect((await ask(`${MARKER}-model`, bearer(BETA_KEY))).status).toBe(404);

    const after = await engineCounts(engine);
    expect(after).toEqual({ received: Number(before.received) + 2, unauthorized: 0 });
    const received = (await (await fetch(`${engine.url}/sim/received`)).json()) as {
      requests: Array<{ system: string | null }>;
    };
    expect(received.requests.slice(-2).map((r) => r.system)).toEqual([MARKER, MARKER]);
  });

  it("gives a pass-through backend its own key, never the client's", async () => {
    const before = await engineCounts(backend);
    const res = await ask('pt', bearer(ALPHA_KEY));
    expect(res.status).toBe(200);
    completions.push(JSON.parse(res.body).choices[0].message.content as string);
    expect(await engineCounts(backend)).toEqual({
      received: Number(before.received) + 1,
      unauthorized: 0,
    });
  });

  it('leaves /healthz and /readyz open, and serves /metrics on GATEWAY_METRICS_PORT only', async () => {
    expect((await fetch(`${gateway.url}/healthz`)).status).toBe(200);
    expect((await fetch(`${gateway.url}/readyz`)).status).toBe(200);
    const onApiPort = await answer(fetch(`${gateway.url}/metrics`));
    expect(onApiPort.status).toBe(404);
    expect(onApiPort.reason).toBe('not_found');
    expect((await fetch(`${gateway.url}/metrics`, { headers: bearer(ALPHA_KEY) })).status).toBe(
      404,
    );
    const scrape = await fetch(`${metricsUrl}/metrics`);
    expect(scrape.status).toBe(200);
    expect(await scrape.text()).toContain('sluice_rejected_total');
    expect(new URL(metricsUrl).port).not.toBe(new URL(gateway.url).port);
  });

  it('logs no key, prompt or completion in any process, at LOG_LEVEL=trace', async () => {
    // The requests above ran: there is something to look for, and logs to look in.
    expect(completions).toHaveLength(3);
    const processes = { gateway, dispatcher, engine, backend };
    for (const [name, proc] of Object.entries(processes)) {
      const log = proc.process.output.join('\n');
      expect(log.length, name).toBeGreaterThan(0);
      for (const secret of [ALPHA_KEY, BETA_KEY, ENGINE_KEY, BACKEND_KEY, MARKER])
        expect(log.includes(secret), `${name} logged ${secret}`).toBe(false);
      for (const text of completions)
        expect(log.includes(text), `${name} logged a completion`).toBe(false);
    }
    expect(gateway.process.output.some((l) => l.includes('"msg":"gateway ready"'))).toBe(true);
  });
});
