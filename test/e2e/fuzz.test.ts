// Property-based fuzzing of a real gateway process: whatever a client sends, the answer is a
// 4xx in the OpenAI error shape (never a 5xx, a hang or a crash), and the gateway still
// answers /healthz afterwards. The configured model is `m`; bodies name it only where a field
// is wrong, so no generated request reaches the engine.
import { isUtf8 } from 'node:buffer';
import { Readable } from 'node:stream';
import fc from 'fast-check';
import { Pool } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startStack, type SluiceProcess, type Stack } from '../support/index.ts';

const MAX_BODY_BYTES = 8192;
let stack: Stack;
let gateway: SluiceProcess;
let pool: Pool;

beforeAll(async () => {
  stack = await startStack({ env: { MAX_BODY_BYTES: String(MAX_BODY_BYTES) } });
  ({ gateway } = stack);
  pool = new Pool(gateway.url, { connections: 4 });
});

afterAll(async () => {
  await pool?.close();
  await stack?.stop();
});

interface Sent {
  method: 'GET' | 'POST' | 'PUT' | 'DELETE' | 'PATCH' | 'OPTIONS';
  path: string;
  headers: Record<string, string>;
  body?: Uint8Array | (() => AsyncIterable<Uint8Array>);
}

const json = (headers: Record<string, string> = {}) => ({
  'content-type': 'application/json',
  ...headers,
});
const utf8 = (s: string) => new TextEncoder().encode(s);
const completionPath = fc.constantFrom('/v1/chat/completions', '/v1/completions');
const post = (body: Uint8Array, path: string, headers = json()): Sent => ({
  method: 'POST',
  path,
  headers,
  body,
});

const validRequest = fc.record({
  model: fc.constantFrom('fuzz', 'gpt-4o', 'M', 'm '),
  messages: fc.array(fc.record({ role: fc.constant('user'), content: fc.string() }), {
    maxLength: 3,
  }),
  stream: fc.boolean(),
  max_tokens: fc.nat(),
});

const nested = fc
  .tuple(fc.integer({ min: 1, max: 20_000 }), fc.constantFrom('[', '{"a":'))
  .map(
    ([depth, open]) =>
      `{"model":"fuzz","x":${open.repeat(depth)}1${(open === '[' ? ']' : '}').repeat(depth)}}`,
  );

// Values vLLM's lax pydantic refuses too (a null model is served by the one pool, "1" is an
// integer, "yes" a boolean: libs/openai/src/lax.ts), so none of these reaches the engine.
const notLax = fc.string().map((s) => `maybe${s}`);
const wrongField = fc.oneof(
  fc.record({
    model: fc.oneof(fc.integer(), fc.boolean(), fc.array(fc.string())),
  }),
  fc.record({
    model: fc.constant('m'),
    stream: fc.oneof(
      notLax,
      fc.integer().filter((n) => n !== 0 && n !== 1),
      fc.object(),
    ),
  }),
  fc.record({
    model: fc.constant('m'),
    // No NaN or infinities: JSON.stringify writes them as null, a max_tokens the gateway
    // rightly passes on (it is OpenAI's "no limit"), so the request would reach the engine.
    max_tokens: fc.oneof(
      fc.integer({ max: -1 }),
      fc.double({ noInteger: true, noNaN: true, noDefaultInfinity: true }),
      notLax,
    ),
  }),
  fc.record({
    model: fc.constant('m'),
    messages: fc.oneof(fc.string(), fc.integer(), fc.object()),
  }),
);

const hugeNumber = fc
  .constantFrom(
    '1e400',
    '-1e400',
    '123456789012345678901234567890',
    '9007199254740993',
    '1.0e308',
    '1e20',
  )
  .map((n) => `{"model":"m","max_tokens":${n},"messages":[]}`);

const duplicateKeys = fc
  .tuple(fc.constantFrom('"m"', '7', 'null'), fc.constantFrom('"fuzz"', '"x"', 'false'))
  .map(([a, b]) => `{"model":${a},"messages":[],"model":${b}}`);

const invalidUtf8 = fc
  .tuple(
    validRequest,
    fc.uint8Array({ minLength: 1, maxLength: 4 }).filter((b) => b.some((x) => x >= 0x80)),
    fc.nat(),
  )
  .map(([request, raw, at]) => {
    const text = utf8(JSON.stringify(request));
    const cut = 10 + (at % Math.max(1, text.length - 11));
    return Uint8Array.from([...text.subarray(0, cut), ...raw, ...text.subarray(cut)]);
  })
  .filter((b) => !isUtf8(b));

const sent: fc.Arbitrary<Sent> = fc.oneof(
  // Random bytes, under any content type.
  fc
    .tuple(
      fc.uint8Array({ maxLength: 2048 }),
      completionPath,
      fc.constantFrom('application/json', 'text/plain', 'application/json; charset=utf-8'),
    )
    .map(([b, path, type]) => post(b, path, { 'content-type': type })),
  // Valid requests cut short.
  fc.tuple(validRequest, fc.nat(), completionPath).map(([r, at, path]) => {
    const text = utf8(JSON.stringify(r));
    return post(text.subarray(0, at % text.length), path);
  }),
  nested.map((t) => post(utf8(t), '/v1/chat/completions')),
  invalidUtf8.map((b) => post(b, '/v1/chat/completions')),
  hugeNumber.map((t) => post(utf8(t), '/v1/completions')),
  duplicateKeys.map((t) => post(utf8(t), '/v1/chat/completions')),
  wrongField.map((r) => post(utf8(JSON.stringify(r)), '/v1/chat/completions')),
  // Well-formed requests for models that are not configured.
  fc.tuple(validRequest, completionPath).map(([r, path]) => post(utf8(JSON.stringify(r)), path)),
  // Chunked bodies past the body limit.
  fc.integer({ min: MAX_BODY_BYTES + 1, max: 4 * MAX_BODY_BYTES }).map((size): Sent => ({
    method: 'POST',
    path: '/v1/chat/completions',
    headers: json(),
    body: async function* () {
      yield utf8('{"model":"m","messages":[{"role":"user","content":"');
      for (let sentBytes = 0; sentBytes < size; sentBytes += 1024) yield utf8('x'.repeat(1024));
      yield utf8('"}]}');
    },
  })),
  // Many headers (under Node's header size limit: 431 has its own test).
  fc
    .tuple(fc.integer({ min: 50, max: 400 }), validRequest)
    .map(([n, r]) =>
      post(
        utf8(JSON.stringify(r)),
        '/v1/chat/completions',
        json(Object.fromEntries(Array.from({ length: n }, (_, i) => [`x-fuzz-${i}`, String(i)]))),
      ),
    ),
  // Unknown routes and wrong methods.
  fc
    .tuple(
      fc.constantFrom('GET', 'POST', 'PUT', 'DELETE', 'PATCH', 'OPTIONS') as fc.Arbitrary<
        Sent['method']
      >,
      fc.oneof(
        fc.string({ maxLength: 40 }).map((s) => `/${encodeURIComponent(s)}x`),
        fc.constantFrom(
          '/v1/chat/completions',
          '/v1/completions',
          '/v1/models',
          '/healthz',
          '/metrics',
          '/readyz',
        ),
      ),
    )
    .filter(
      ([method, path]) =>
        !(method === 'GET' && !path.endsWith('x')) &&
        !(method === 'POST' && path.startsWith('/v1/') && path.endsWith('completions')),
    )
    .map(([method, path]): Sent => ({ method, path, headers: {} })),
);

async function send(s: Sent) {
  const res = await pool.request({
    method: s.method,
    path: s.path,
    headers: s.headers,
    // A stream of unknown length goes out chunked.
    body: typeof s.body === 'function' ? Readable.from(s.body()) : s.body,
    // Generous against a busy machine; what it catches is a gateway that never answers.
    headersTimeout: 15_000,
    bodyTimeout: 15_000,
  });
  return { status: res.statusCode, headers: res.headers, text: await res.body.text() };
}

async function tooLargeCount(): Promise<number> {
  const text = await (await fetch(`${gateway.url}/metrics`)).text();
  const line = /^sluice_rejected_total\{model="unknown",reason="body_too_large"\} (\d+)$/m.exec(
    text,
  );
  return Number(line?.[1] ?? 0);
}

/**
 * A body past the limit is answered 413 at once and the connection closed (the client may
 * still be sending), so the client can see the close before the answer: a reset or broken
 * pipe is accepted there when the gateway counted the 413.
 */
async function sendPastLimit(s: Sent) {
  const before = await tooLargeCount();
  try {
    return await send(s);
  } catch (err) {
    const code = (err as { code?: string }).code;
    expect(['EPIPE', 'ECONNRESET', 'UND_ERR_SOCKET']).toContain(code);
    expect(await tooLargeCount()).toBe(before + 1);
    return undefined;
  }
}

describe('fuzzing the gateway', () => {
  it('answers anything with a 4xx in the OpenAI error shape, and stays up', async () => {
    await fc.assert(
      fc.asyncProperty(sent, async (s) => {
        const answer = typeof s.body === 'function' ? await sendPastLimit(s) : await send(s);
        if (!answer) return;
        const { status, headers, text } = answer;
        expect(status, text).toBeGreaterThanOrEqual(400);
        expect(status, text).toBeLessThan(500);
        const reason = headers['x-sluice-reject-reason'];
        expect(typeof reason).toBe('string');
        expect(JSON.parse(text)).toEqual({
          error: {
            message: expect.any(String),
            type: 'invalid_request_error',
            param: null,
            code: reason,
          },
        });
      }),
      { numRuns: 1000 },
    );
    expect(gateway.process.child.exitCode).toBeNull();
    expect((await fetch(`${gateway.url}/healthz`)).status).toBe(200);
    const metrics = await (await fetch(`${gateway.url}/metrics`)).text();
    expect(metrics).toMatch(/^sluice_held_requests 0$/m);
    expect((await stack.sim.state()).receivedTotal).toBe(0);
  }, 120_000);
});
