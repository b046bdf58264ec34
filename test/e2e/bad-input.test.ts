// Every boundary answers bad input with the documented status and a message that says
// what was wrong; the process stays up and nothing reaches the engine.
import { connect } from 'node:net';
import { keySpace } from '@sluice/protocol';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  eventually,
  startStack,
  type SluiceProcess,
  type Stack,
  type TestEngineSim,
} from '../support/index.ts';

let stack: Stack;
let sim: TestEngineSim;
let gateway: SluiceProcess;

beforeAll(async () => {
  stack = await startStack({ env: { ADMISSION_MAX_INFLIGHT: '4', MAX_BODY_BYTES: '262144' } });
  ({ sim, gateway } = stack);
});

afterAll(() => stack?.stop());

function post(body: string | Buffer, contentType = 'application/json') {
  return fetch(`${gateway.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': contentType },
    body,
  });
}

const deep = `{"model":"m","messages":[{"role":"user","content":"x"}],"junk":${'['.repeat(100_000)}${']'.repeat(100_000)}}`;

describe('bad input at the gateway', () => {
  it.each([
    [
      'malformed JSON',
      '{"model": "m", "messages": [',
      400,
      'bad_request',
      /invalid JSON at byte \d+/,
    ],
    ['a body that is not an object', '["model"]', 400, 'bad_request', /JSON object/],
    ['a model that is not a string', '{"model":5,"messages":[]}', 400, 'bad_request', /model/],
    [
      'a non-string model',
      '{"model":7,"messages":[]}',
      400,
      'bad_request',
      /model must be a string/,
    ],
    ['a non-boolean stream', '{"model":"m","stream":"maybe"}', 400, 'bad_request', /stream/],
    ['a negative max_tokens', '{"model":"m","max_tokens":-1}', 400, 'bad_request', /max_tokens/],
    ['a body nested 100,000 deep', deep, 400, 'bad_request', /depth|nest/i],
    [
      'an unknown model',
      '{"model":"gpt-9","messages":[]}',
      404,
      'model_not_found',
      /The model `gpt-9` does not exist/,
    ],
  ])(
    'answers %s with its 4xx and says what was wrong',
    async (_name, body, status, reason, message) => {
      const res = await post(body);
      expect(res.status).toBe(status);
      expect(res.headers.get('x-sluice-reject-reason')).toBe(reason);
      const error = (
        (await res.json()) as { error: { message: string; code: string; type: string } }
      ).error;
      expect(error.message).toMatch(message);
      expect(error.code).toBe(reason);
      expect(error.type).toBe('invalid_request_error');
    },
  );

  it('answers a body over MAX_BODY_BYTES with 413 naming the limit', async () => {
    const res = await post(
      JSON.stringify({ model: 'm', messages: [{ role: 'user', content: 'x'.repeat(300_000) }] }),
    );
    expect(res.status).toBe(413);
    expect(res.headers.get('x-sluice-reject-reason')).toBe('body_too_large');
    expect(((await res.json()) as { error: { message: string } }).error.message).toContain(
      'MAX_BODY_BYTES (262144 bytes)',
    );
  });

  it('answers a body that is not JSON with 415', async () => {
    const res = await post('model=m', 'application/x-www-form-urlencoded');
    expect(res.status).toBe(415);
    expect(res.headers.get('x-sluice-reject-reason')).toBe('unsupported_media_type');
  });

  it('answers invalid UTF-8 with 400 saying at which byte', async () => {
    const before = '{"model":"m","messages":[{"role":"user","content":"a';
    const body = Buffer.concat([
      Buffer.from(before),
      Buffer.from([0xc3, 0x28]),
      Buffer.from('"}]}'),
    ]);
    const res = await post(body);
    expect(res.status).toBe(400);
    expect(res.headers.get('x-sluice-reject-reason')).toBe('bad_request');
    const error = ((await res.json()) as { error: { message: string } }).error;
    expect(error.message).toBe(`invalid JSON at byte ${before.length}: invalid UTF-8 (byte 0xc3)`);
  });

  it.each([
    ['an unknown route', 'GET', '/v1/rerank', 404, 'not_found'],
    ['a wrong method on the embeddings route', 'GET', '/v1/embeddings', 405, 'method_not_allowed'],
    ['an unknown route with a body', 'POST', '/nope', 404, 'not_found'],
    ['a path that reads as a route pattern', 'GET', '/*x/:id', 404, 'not_found'],
    ['a wrong method', 'GET', '/v1/chat/completions', 405, 'method_not_allowed'],
    ['a wrong method on an ops route', 'POST', '/healthz', 405, 'method_not_allowed'],
  ])('answers %s in the OpenAI shape', async (_name, method, path, status, reason) => {
    const res = await fetch(`${gateway.url}${path}`, {
      method,
      ...(method === 'POST' ? { headers: { 'content-type': 'application/json' }, body: '{}' } : {}),
    });
    expect(res.status).toBe(status);
    expect(res.headers.get('x-sluice-reject-reason')).toBe(reason);
    const error = ((await res.json()) as { error: Record<string, unknown> }).error;
    expect(error).toEqual({
      message: expect.any(String),
      type: 'invalid_request_error',
      param: null,
      code: reason,
    });
    if (status === 405) expect(res.headers.get('allow')).toMatch(/GET|POST/);
  });

  it('answers headers over the limit with 431 in the OpenAI shape', async () => {
    const res = await rawRequest(
      `POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Big: ${'a'.repeat(20_000)}\r\ncontent-length: 2\r\n\r\n{}`,
    );
    expect(res.status).toBe(431);
    expect(res.headers['x-sluice-reject-reason']).toBe('headers_too_large');
    expect(JSON.parse(res.body)).toEqual({
      error: {
        message: expect.any(String),
        type: 'invalid_request_error',
        param: null,
        code: 'headers_too_large',
      },
    });
  });

  it('answers bytes that are not HTTP with 400 in the OpenAI shape', async () => {
    const res = await rawRequest('GARBAGE\x01 / HTTP/1.1\r\n\r\n');
    expect(res.status).toBe(400);
    expect(JSON.parse(res.body).error.code).toBe('bad_request');
  });

  it('counts what the HTTP parser refused under the model label "unknown"', async () => {
    const text = await (await fetch(`${gateway.url}/metrics`)).text();
    expect(text).toMatch(/sluice_rejected_total\{model="unknown",reason="headers_too_large"\} 1/);
  });

  it('stays up, and nothing of the above reached the engine', async () => {
    expect((await fetch(`${gateway.url}/healthz`)).status).toBe(200);
    const ok = await post(
      JSON.stringify({ model: 'm', messages: [{ role: 'user', content: 'fine' }], max_tokens: 2 }),
    );
    expect(ok.status).toBe(200);
    expect((await sim.state()).receivedTotal).toBe(1);
  });

  it('serves a body without a model from the one pool, as vLLM serves its own model', async () => {
    const res = await post(
      JSON.stringify({ messages: [{ role: 'user', content: 'no model named' }], max_tokens: 2 }),
    );
    expect(res.status).toBe(200);
    expect(((await res.json()) as { model: string }).model).toBe('m');
    expect((await sim.state()).receivedTotal).toBe(2);
  });

  it('reports readiness: Redis reachable and a dispatcher leading', async () => {
    const res = await fetch(`${gateway.url}/readyz`);
    expect(res.status).toBe(200);
    expect(await res.json()).toEqual({
      redis: true,
      replies: true,
      leaders: { default: true },
      models: true,
    });
  });

  it('counts and drops reply messages that do not decode, and keeps serving', async () => {
    const { replica } = (await (await fetch(`${gateway.url}/healthz`)).json()) as {
      replica: string;
    };
    const client = new Redis(stack.redis.url);
    const channel = keySpace('sluice').replyChannel(replica);
    // A bundle whose length runs past its end, and a frame of an unknown type.
    await client.publish(channel, Buffer.from([0x42, 0, 0, 0, 9, 0x45]));
    await client.publish(channel, Buffer.from('Qnot-a-frame'));
    await client.quit();
    const counted = (kind: string) => async () => {
      const text = await (await fetch(`${gateway.url}/metrics`)).text();
      const line = text
        .split('\n')
        .find((l) => l.startsWith(`sluice_bad_frames_total{kind="${kind}"}`));
      return line?.endsWith(' 1') ? true : undefined;
    };
    await eventually(counted('undecodable'), 'the bad bundle to be counted');
    await eventually(counted('unknown_job'), 'the stray frame to be counted');
    const ok = await post(
      JSON.stringify({
        model: 'm',
        messages: [{ role: 'user', content: 'still fine' }],
        max_tokens: 2,
      }),
    );
    expect(ok.status).toBe(200);
  });
});

/** Sends raw bytes and reads the whole answer (the server closes after an error). */
function rawRequest(
  text: string,
): Promise<{ status: number; headers: Record<string, string>; body: string }> {
  const { hostname, port } = new URL(gateway.url);
  return new Promise((resolve, reject) => {
    const socket = connect({ host: hostname, port: Number(port) }, () => socket.end(text));
    const chunks: Buffer[] = [];
    socket.on('data', (c: Buffer) => chunks.push(c));
    socket.on('error', reject);
    socket.on('close', () => {
      const raw = Buffer.concat(chunks).toString('utf8');
      const [head = '', body = ''] = raw.split('\r\n\r\n');
      const [statusLine = '', ...lines] = head.split('\r\n');
      const headers = Object.fromEntries(
        lines.map((l) => [
          l.slice(0, l.indexOf(':')).toLowerCase(),
          l.slice(l.indexOf(':') + 1).trim(),
        ]),
      );
      resolve({ status: Number(statusLine.split(' ')[1]), headers, body });
    });
  });
}
