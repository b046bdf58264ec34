// The gateway's access log, x-request-id and response metrics on a real stack: Redis, a
// dispatcher, a gateway, a gated engine simulator (one slot, a queue of one) and a pass-through
// backend, with a tenant's key. Every completion request leaves exactly one line (served
// streams and plain answers, refusals, a full queue, clients that leave), the metrics move with
// the codes and token counts the lines give, and no process writes a prompt, a completion or
// a key.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  eventually,
  queuedJobs,
  readAll,
  startDispatcher,
  startEngineSim,
  startGateway,
  startRedis,
  type SluiceProcess,
  type TestEngineSim,
  type TestRedis,
  untilReady,
} from '../support/index.ts';

const KEY = 'sk-alpha-access-log-9c1d2e-01234';
// Text that exists only in this test's requests, and so may appear in no log line.
const MARKER = 'PROMPT-MARKER-access-log-5e7a';
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;

let redis: TestRedis;
let engine: TestEngineSim;
let backend: TestEngineSim;
let dispatcher: SluiceProcess;
let gateway: SluiceProcess;
let client: Redis;
let dir: string;
/** Completion texts the engines wrote for this test's requests. */
const completions: string[] = [];

beforeAll(async () => {
  redis = await startRedis();
  [engine, backend] = await Promise.all([
    // 10 ms a token: a long answer holds the one slot for minutes at next to no CPU.
    startEngineSim(
      ['--profile', 'instant', '--model', 'm', '--step-overhead-seconds', '0.01'].concat([
        '--max-model-len',
        '200000',
      ]),
    ),
    startEngineSim(['--profile', 'instant', '--model', 'pt']),
  ]);
  dir = mkdtempSync(join(tmpdir(), 'sluice-access-log-'));
  const config = join(dir, 'sluice.yaml');
  writeFileSync(
    config,
    [
      'pools:',
      '  - name: p',
      '    models: [m]',
      '    queueDepth: 1',
      '    engines:',
      `      - { url: "${engine.url}", maxInflight: 1 }`,
      'passthrough:',
      `  - { model: pt, url: "${backend.url}" }`,
      'tenants:',
      '  - name: alpha',
      `    apiKeys: [${KEY}]`,
      '',
    ].join('\n'),
  );
  const env = { REDIS_URL: redis.url, SLUICE_CONFIG: config };
  dispatcher = await startDispatcher(env);
  gateway = await startGateway(env);
  client = new Redis(redis.url);
  await untilReady(gateway);
}, 60_000);

afterAll(async () => {
  await client?.quit();
  await gateway?.stop();
  await dispatcher?.stop();
  await Promise.all([engine?.stop(), backend?.stop()]);
  await redis?.stop();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

type Line = Record<string, unknown>;

/** The access-log line of request `id`, once the gateway has written it. */
async function accessLine(id: string): Promise<Line> {
  const match = await gateway.process.waitForLine(new RegExp(`"kind":"access","id":"${id}"`));
  return JSON.parse(match.input!) as Line;
}

const accessLines = (id: string) =>
  gateway.process.output.filter((l) => l.includes(`"kind":"access","id":"${id}"`));

function post(
  path: string,
  body: Record<string, unknown>,
  headers: Record<string, string> = {},
  signal?: AbortSignal,
) {
  return fetch(`${gateway.url}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${KEY}`, ...headers },
    body: JSON.stringify(body),
    ...(signal ? { signal } : {}),
  });
}

const chatBody = (extra: Record<string, unknown> = {}) => ({
  model: 'm',
  messages: [{ role: 'user', content: `${MARKER} tell me` }],
  max_tokens: 6,
  ignore_eos: true,
  ...extra,
});

/** Every sample of /metrics as `name{label="v",...}` (labels sorted) -> value. */
async function scrape(): Promise<Map<string, number>> {
  // With tenants, the API port's /metrics needs a key.
  const text = await (
    await fetch(`${gateway.url}/metrics`, { headers: { authorization: `Bearer ${KEY}` } })
  ).text();
  const samples = new Map<string, number>();
  for (const line of text.split('\n')) {
    const m = /^(\w+)(?:\{(.*)\})? (\S+)$/.exec(line);
    if (!m) continue;
    const labels = (m[2] ?? '')
      .split(/,(?=\w+=")/)
      .filter(Boolean)
      .sort()
      .join(',');
    samples.set(`${m[1]}{${labels}}`, Number(m[3]));
  }
  return samples;
}

/** How much each of `keys` grew between two scrapes. */
function grew(before: Map<string, number>, after: Map<string, number>, keys: string[]) {
  return Object.fromEntries(keys.map((k) => [k, (after.get(k) ?? 0) - (before.get(k) ?? 0)]));
}

const responses = (model: string, code: number) =>
  `sluice_responses_total{code="${code}",model="${model}"}`;
const tenantResponses = (code: number) =>
  `sluice_tenant_responses_total{code="${code}",tenant="alpha"}`;
const tokens = (kind: string) => `sluice_tokens_total{kind="${kind}",model="m"}`;
const durations = (model: string) => `sluice_request_duration_seconds_count{model="${model}"}`;

/** The `data:` events of an SSE body, parsed (without `[DONE]`). */
function events(body: string): Record<string, unknown>[] {
  return body
    .split('\n\n')
    .filter((e) => e.startsWith('data: {'))
    .map((e) => JSON.parse(e.slice(6)) as Record<string, unknown>);
}

describe('access log, x-request-id and response metrics', () => {
  it("logs a served stream under the client's id, with the engine's usage, and moves the metrics", async () => {
    const before = await scrape();
    const res = await post(
      '/v1/chat/completions',
      chatBody({ stream: true, stream_options: { include_usage: true } }),
      { 'x-request-id': 'e2e-stream-1' },
    );
    expect(res.headers.get('x-request-id')).toBe('e2e-stream-1');
    const chunks = events(await readAll(res));
    const usage = chunks.at(-1)!['usage'] as { prompt_tokens: number; completion_tokens: number };
    expect(usage.completion_tokens).toBe(6);
    completions.push(
      chunks
        .map((c) => (c['choices'] as { delta?: { content?: string } }[])[0]?.delta?.content ?? '')
        .join(''),
    );

    const line = await accessLine('e2e-stream-1');
    expect(line).toMatchObject({
      level: 30,
      msg: 'request',
      model: 'm',
      pool: 'p',
      tenant: 'alpha',
      stream: true,
      status: 200,
      promptTokens: usage.prompt_tokens,
      completionTokens: 6,
    });
    expect(line['jobId']).toEqual(expect.any(String));
    expect(line).not.toHaveProperty('reason');
    expect(line).not.toHaveProperty('promptTokensEstimated');
    const { queueWaitMs, ttftMs, durationMs } = line as Record<string, number>;
    expect(queueWaitMs).toBeGreaterThanOrEqual(0);
    expect(ttftMs).toBeGreaterThanOrEqual(0);
    expect(durationMs).toBeGreaterThanOrEqual(ttftMs!);

    const after = await scrape();
    expect(
      grew(before, after, [
        responses('m', 200),
        tenantResponses(200),
        tokens('prompt'),
        tokens('completion'),
        durations('m'),
        'sluice_ttft_seconds_count{model="m"}',
      ]),
    ).toEqual({
      [responses('m', 200)]: 1,
      [tenantResponses(200)]: 1,
      [tokens('prompt')]: usage.prompt_tokens,
      [tokens('completion')]: 6,
      [durations('m')]: 1,
      'sluice_ttft_seconds_count{model="m"}': 1,
    });
    expect(accessLines('e2e-stream-1')).toHaveLength(1);
  });

  it('replaces an unsafe id with its own, and counts a stream without usage from its events', async () => {
    const before = await scrape();
    const res = await post(
      '/v1/completions',
      { model: 'm', prompt: `${MARKER} go on`, max_tokens: 5, ignore_eos: true, stream: true },
      { 'x-request-id': 'not a safe id"}' },
    );
    const id = res.headers.get('x-request-id')!;
    expect(id).toMatch(UUID);
    const chunks = events(await readAll(res));
    completions.push(
      chunks.map((c) => (c['choices'] as { text?: string }[])[0]?.text ?? '').join(''),
    );
    const line = await accessLine(id);
    expect(line).toMatchObject({ status: 200, stream: true, completionTokens: 5 });
    // No usage: the prompt is the gateway's estimate, and the line says so.
    expect(line['promptTokensEstimated']).toBe(true);
    expect(line['promptTokens']).toBeGreaterThan(0);
    expect(gateway.process.output.some((l) => l.includes('not a safe id'))).toBe(false);
    const after = await scrape();
    expect(grew(before, after, [tokens('prompt'), tokens('completion')])).toEqual({
      [tokens('prompt')]: line['promptTokens'],
      [tokens('completion')]: 5,
    });
  });

  it('logs a non-streaming answer with the usage of its body', async () => {
    const res = await post('/v1/chat/completions', chatBody({ max_tokens: 8 }), {
      'x-request-id': 'e2e-plain-1',
    });
    expect(res.status).toBe(200);
    expect(res.headers.get('x-request-id')).toBe('e2e-plain-1');
    const body = (await res.json()) as {
      choices: { message: { content: string } }[];
      usage: { prompt_tokens: number; completion_tokens: number };
    };
    completions.push(body.choices[0]!.message.content);
    expect(await accessLine('e2e-plain-1')).toMatchObject({
      stream: false,
      status: 200,
      promptTokens: body.usage.prompt_tokens,
      completionTokens: 8,
    });
  });

  it('logs a pass-through request under its id, with no token counts', async () => {
    const res = await post(
      '/v1/chat/completions',
      { model: 'pt', messages: [{ role: 'user', content: `${MARKER} pass` }], max_tokens: 6 },
      { 'x-request-id': 'e2e-pass-1' },
    );
    expect(res.status).toBe(200);
    expect(res.headers.get('x-request-id')).toBe('e2e-pass-1');
    const body = (await res.json()) as { choices: { message: { content: string } }[] };
    completions.push(body.choices[0]!.message.content);
    const line = await accessLine('e2e-pass-1');
    expect(line).toMatchObject({ model: 'pt', passthrough: true, status: 200, tenant: 'alpha' });
    expect(line).not.toHaveProperty('pool');
    expect(line).not.toHaveProperty('promptTokens');
    expect(line).not.toHaveProperty('completionTokens');
  });

  it('logs refusals: an unknown model and a missing key, each under its id', async () => {
    const before = await scrape();
    const unknown = await post(
      '/v1/chat/completions',
      chatBody({ model: `${MARKER}-model`, stream: true }),
      { 'x-request-id': 'e2e-404' },
    );
    expect(unknown.status).toBe(404);
    expect(unknown.headers.get('x-request-id')).toBe('e2e-404');
    await unknown.text();
    expect(await accessLine('e2e-404')).toMatchObject({
      model: 'unknown',
      tenant: 'alpha',
      status: 404,
      reason: 'model_not_found',
      // Its body was read: the line says what it asked.
      stream: true,
    });

    const keyless = await fetch(`${gateway.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-request-id': 'e2e-401' },
      body: JSON.stringify(chatBody()),
    });
    expect(keyless.status).toBe(401);
    expect(keyless.headers.get('x-request-id')).toBe('e2e-401');
    await keyless.text();
    const line = await accessLine('e2e-401');
    expect(line).toMatchObject({ model: 'unknown', status: 401, reason: 'invalid_api_key' });
    expect(line).not.toHaveProperty('tenant');
    expect(line).not.toHaveProperty('stream');

    const after = await scrape();
    expect(grew(before, after, [responses('unknown', 404), responses('unknown', 401)])).toEqual({
      [responses('unknown', 404)]: 1,
      [responses('unknown', 401)]: 1,
    });
  });

  it('logs a full queue and clients that leave, queued and running, as 503 and 499', async () => {
    const before = await scrape();
    // A long stream holds the pool's one slot.
    const running = new AbortController();
    const blocker = await post(
      '/v1/chat/completions',
      chatBody({ stream: true, max_tokens: 100_000 }),
      { 'x-request-id': 'e2e-blocker' },
      running.signal,
    );
    // Its first token: it runs on the engine.
    const reader = blocker.body!.getReader();
    const decoder = new TextDecoder();
    let seen = '';
    while (!seen.includes('"content":"')) {
      const { value } = await reader.read();
      seen += decoder.decode(value, { stream: true });
    }

    // The next waits in the queue (depth 1), and the one after finds it full.
    const queued = new AbortController();
    const waiting = post(
      '/v1/chat/completions',
      chatBody(),
      { 'x-request-id': 'e2e-queued' },
      queued.signal,
    ).catch(() => undefined);
    await eventually(
      async () => ((await queuedJobs(client, 'sluice', 'p')) === 1 ? true : undefined),
      'the second request to be queued',
    );
    const full = await post('/v1/chat/completions', chatBody(), { 'x-request-id': 'e2e-full' });
    expect(full.status).toBe(503);
    expect(full.headers.get('x-request-id')).toBe('e2e-full');
    await full.text();
    expect(await accessLine('e2e-full')).toMatchObject({
      model: 'm',
      pool: 'p',
      status: 503,
      reason: 'queue_full',
    });

    queued.abort();
    await waiting;
    const left = await accessLine('e2e-queued');
    expect(left).toMatchObject({ pool: 'p', status: 499, reason: 'cancelled', stream: false });
    expect(left).not.toHaveProperty('ttftMs');
    expect(left).not.toHaveProperty('completionTokens');

    running.abort();
    await reader.read().catch(() => undefined);
    const gone = await accessLine('e2e-blocker');
    expect(gone).toMatchObject({ status: 499, reason: 'cancelled', stream: true });
    expect(gone['ttftMs']).toEqual(expect.any(Number));
    expect(gone).not.toHaveProperty('completionTokens');

    const after = await scrape();
    expect(
      grew(before, after, [responses('m', 503), responses('m', 499), tenantResponses(499)]),
    ).toEqual({ [responses('m', 503)]: 1, [responses('m', 499)]: 2, [tenantResponses(499)]: 2 });
    for (const id of ['e2e-blocker', 'e2e-queued', 'e2e-full'])
      expect(accessLines(id)).toHaveLength(1);
  }, 60_000);

  it('writes no prompt, completion or key in any process output', () => {
    // Texts of a few characters could match a number or a word of any line by chance.
    const texts = completions.filter((c) => c.length >= 12);
    expect(texts.length).toBeGreaterThanOrEqual(2);
    // One line per request of this file: nine, none twice.
    expect(gateway.process.output.filter((l) => l.includes('"kind":"access"'))).toHaveLength(9);
    for (const proc of [gateway, dispatcher])
      for (const line of proc.process.output) {
        expect(line).not.toContain(MARKER);
        expect(line).not.toContain(KEY);
        for (const text of texts) expect(line).not.toContain(text);
      }
  });
});
