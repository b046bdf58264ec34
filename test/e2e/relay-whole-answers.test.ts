// Non-streamed answers through the whole stack, from an engine that answers as the test says:
// a large answer (several data frames, not one message) reaches the client intact; one that
// breaks before it outgrew one frame gets a clean 502 `engine_error` in the OpenAI shape
// instead of an empty reply; a larger one already under way ends with a cut connection,
// never a truncated body that looks whole.
import { once } from 'node:events';
import { createServer, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  answer,
  chat,
  startDispatcher,
  startGateway,
  startRedis,
  untilReady,
  type SluiceProcess,
  type TestRedis,
} from '../support/index.ts';

/** Bytes of a JSON string member's text, so the answer is JSON when it is whole. */
const filler = (n: number) =>
  'abcdefghijklmnopqrstuvwxyz0123456789'.repeat(Math.ceil(n / 36)).slice(0, n);

/** A complete chat completion of about `n` bytes. */
const completion = (n: number) =>
  JSON.stringify({
    id: 'cmpl-1',
    object: 'chat.completion',
    model: 'm',
    choices: [{ index: 0, message: { role: 'assistant', content: filler(n) } }],
  });

/** What the engine does with a request, by the prompt's text. */
const behaviours: Record<string, (res: ServerResponse) => void> = {
  large: (res) => {
    const body = completion(3 * 1024 * 1024);
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': body.length });
    res.end(body);
  },
  'broken-small': (res) => breakAfter(res, completion(10_000), 4_000),
  'broken-large': (res) => breakAfter(res, completion(2 * 1024 * 1024), 1024 * 1024),
};

/** Announces the whole `body`, sends its first `sent` bytes, then cuts the connection. */
function breakAfter(res: ServerResponse, body: string, sent: number) {
  res.writeHead(200, { 'content-type': 'application/json', 'content-length': body.length });
  res.write(body.slice(0, sent), () => res.socket?.destroy());
}

let engine: Server;
let redis: TestRedis;
const processes: SluiceProcess[] = [];
let gateway: SluiceProcess;

beforeAll(async () => {
  engine = createServer((req, res) => {
    if (req.method !== 'POST') return void res.writeHead(404).end();
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const request = JSON.parse(Buffer.concat(chunks).toString()) as {
        messages: Array<{ content: string }>;
      };
      const behave = behaviours[request.messages.at(-1)!.content];
      if (behave) behave(res);
      else res.writeHead(400).end();
    });
  });
  engine.listen(0, '127.0.0.1');
  await once(engine, 'listening');
  const { port } = engine.address() as AddressInfo;
  redis = await startRedis();
  const env = {
    REDIS_URL: redis.url,
    VLLM_URL: `http://127.0.0.1:${port}`,
    VLLM_MODEL: 'm',
    ADMISSION_MAX_INFLIGHT: '4',
  };
  processes.push(await startDispatcher(env));
  gateway = await startGateway(env);
  processes.push(gateway);
  await untilReady(gateway);
});

afterAll(async () => {
  for (const p of processes.reverse()) await p.stop();
  await redis?.stop();
  engine?.closeAllConnections();
  engine?.close();
});

describe('non-streamed answers through the relay', () => {
  it('delivers a 3 MB answer intact', async () => {
    const a = await answer(chat(gateway.url, 'large', { stream: false }));
    expect(a.status).toBe(200);
    expect(a.body).toBe(completion(3 * 1024 * 1024));
  });

  it('answers one that breaks within its first frame with a clean 502 engine_error', async () => {
    const a = await answer(chat(gateway.url, 'broken-small', { stream: false }));
    expect(a).toMatchObject({ status: 502, reason: 'engine_error', retryAfter: null });
    expect(JSON.parse(a.body)).toEqual({
      error: {
        message: expect.stringContaining('failed mid-response'),
        type: 'server_error',
        param: null,
        code: 'engine_error',
      },
    });
  });

  it('cuts the connection of a larger one that breaks after its head went out', async () => {
    const a = await answer(chat(gateway.url, 'broken-large', { stream: false }));
    expect(a.status).toBe(200);
    expect(a.body).toMatch(/\ntransport error: /);
  });
});
