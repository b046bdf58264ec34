// A large non-streamed answer (logprobs, prompt_logprobs, a large n) to a client reading at
// an ordinary speed. The dispatcher relays it in 256 KiB frames, far faster than the client
// reads; until December 2026 the gateway held the answer's own earlier frames against
// SLUICE_SLOW_CLIENT_BYTES and cut the client with 499 slow_client (a 12 MB answer read at
// 3 MB/s got 4-6 MB). The engine's work is done by then: the answer must arrive whole.
import { once } from 'node:events';
import { createServer, type Server } from 'node:http';
import { connect, type AddressInfo, type Socket } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  metricSum,
  startDispatcher,
  startGateway,
  startRedis,
  untilReady,
  type SluiceProcess,
  type TestRedis,
} from '../support/index.ts';

const MB = 1_000_000;

/** A complete chat completion of about `n` bytes: JSON only when it arrives whole. */
const completion = (n: number) =>
  JSON.stringify({
    id: 'cmpl-1',
    object: 'chat.completion',
    model: 'm',
    choices: [
      {
        index: 0,
        message: {
          role: 'assistant',
          content: 'abcdefghijklmnopqrstuvwxyz0123456789'.repeat(Math.ceil(n / 36)).slice(0, n),
        },
      },
    ],
  });

const ANSWER = completion(12 * MB);

let engine: Server;
let redis: TestRedis;
const processes: SluiceProcess[] = [];
let gateway: SluiceProcess;

beforeAll(async () => {
  // An engine that answers every completion with the large answer, at once and whole, as
  // vLLM sends a non-streamed answer once it is generated.
  engine = createServer((req, res) => {
    if (req.method !== 'POST') return void res.writeHead(404).end();
    req.resume();
    req.on('end', () => {
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': ANSWER.length });
      res.end(ANSWER);
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
    // Far below the answer, whatever the kernel's socket buffers take of it: the bound must
    // not be what decides.
    SLUICE_SLOW_CLIENT_BYTES: String(MB),
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

/**
 * Reads `socket` at about `bytesPerSecond`, pausing it after each slice: a client on a slow
 * link. Resolves with every byte once the connection closed (a cut included).
 */
function readAt(socket: Socket, bytesPerSecond: number): Promise<Buffer> {
  const slice = 64 * 1024;
  const chunks: Buffer[] = [];
  let inSlice = 0;
  socket.on('data', (chunk: Buffer) => {
    chunks.push(chunk);
    inSlice += chunk.length;
    if (inSlice < slice) return;
    // The reader's pace, not a wait for anything.
    socket.pause();
    setTimeout(() => socket.resume(), (inSlice / bytesPerSecond) * 1000);
    inSlice = 0;
  });
  socket.on('error', () => {});
  return once(socket, 'close').then(() => Buffer.concat(chunks));
}

/** Status line and body of a raw HTTP/1.1 response in chunked transfer coding. */
function parse(response: Buffer): { status: string; body: string } {
  const headEnd = response.indexOf('\r\n\r\n');
  const status = response.toString('latin1', 0, response.indexOf('\r\n'));
  const parts: Buffer[] = [];
  for (let at = headEnd + 4; ;) {
    const eol = response.indexOf('\r\n', at);
    const size = parseInt(response.toString('latin1', at, eol), 16);
    if (eol < 0 || !(size >= 0)) return { status, body: `${Buffer.concat(parts)}<cut>` };
    if (size === 0) return { status, body: Buffer.concat(parts).toString() };
    parts.push(response.subarray(eol + 2, eol + 2 + size));
    at = eol + 2 + size + 2;
  }
}

describe('a large non-streamed answer to a client reading at an ordinary speed', () => {
  it('arrives whole at 3 MB/s, with no slow_client', async () => {
    const body = JSON.stringify({ model: 'm', messages: [{ role: 'user', content: 'large' }] });
    const socket = connect(Number(new URL(gateway.url).port), '127.0.0.1');
    await once(socket, 'connect');
    const received = readAt(socket, 3 * MB);
    socket.write(
      `POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: ${body.length}\r\n\r\n${body}`,
    );
    const { status, body: answer } = parse(await received);
    expect(status).toBe('HTTP/1.1 200 OK');
    expect(answer.length).toBe(ANSWER.length);
    expect(answer === ANSWER).toBe(true);
    expect(
      (await metricSum(gateway.url, 'sluice_rejected_total', { reason: 'slow_client' })) ?? 0,
    ).toBe(0);
  }, 120_000);
});
