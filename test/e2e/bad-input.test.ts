// Every boundary answers bad input with the documented status and a message that says
// what was wrong; the process stays up and nothing reaches the engine.
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
    ['a missing model', '{"messages":[]}', 400, 'bad_request', /model/],
    [
      'a non-string model',
      '{"model":7,"messages":[]}',
      400,
      'bad_request',
      /model must be a string/,
    ],
    ['a non-boolean stream', '{"model":"m","stream":"yes"}', 400, 'bad_request', /stream/],
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

  it('stays up, and nothing of the above reached the engine', async () => {
    expect((await fetch(`${gateway.url}/healthz`)).status).toBe(200);
    const ok = await post(
      JSON.stringify({ model: 'm', messages: [{ role: 'user', content: 'fine' }], max_tokens: 2 }),
    );
    expect(ok.status).toBe(200);
    expect((await sim.state()).receivedTotal).toBe(1);
  });

  it('reports readiness: Redis reachable and a dispatcher leading', async () => {
    const res = await fetch(`${gateway.url}/readyz`);
    expect(res.status).toBe(200);
    expect(await res.json()).toEqual({ redis: true, leaders: { default: true } });
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
