// A client that trickles or withholds its request is timed out after
// GATEWAY_REQUEST_TIMEOUT_SECONDS (1 s here) with a 408 in the OpenAI shape, and holds
// nothing; the timeout covers receiving the request only, never a held answer.
import { connect, type Socket } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { eventually, startStack, type SluiceProcess, type Stack } from '../support/index.ts';

let stack: Stack;
let gateway: SluiceProcess;

beforeAll(async () => {
  stack = await startStack({
    // Each answer takes about 2 s of steps: longer than the request timeout.
    sim: ['--step-overhead-seconds', '0.2'],
    env: { GATEWAY_REQUEST_TIMEOUT_SECONDS: '1' },
  });
  ({ gateway } = stack);
});

afterAll(() => stack?.stop());

/** Opens a socket, sends `text`, and collects all it gets until the server closes. */
function openAndSend(text: string): { socket: Socket; answer: Promise<string> } {
  const { hostname, port } = new URL(gateway.url);
  const socket = connect({ host: hostname, port: Number(port) }, () => socket.write(text));
  const answer = new Promise<string>((resolve) => {
    const chunks: Buffer[] = [];
    socket.on('data', (c: Buffer) => chunks.push(c));
    socket.on('error', () => {});
    socket.on('close', () => resolve(Buffer.concat(chunks).toString('utf8')));
  });
  return { socket, answer };
}

async function metric(name: string): Promise<string | undefined> {
  const text = await (await fetch(`${gateway.url}/metrics`)).text();
  return text.split('\n').find((l) => l.startsWith(name));
}

function expect408(answer: string) {
  // A 408 in the OpenAI shape; a bare close (empty answer) is the other acceptable outcome.
  if (answer === '') return;
  expect(answer).toMatch(/^HTTP\/1\.1 408 /);
  expect(answer).toMatch(/x-sluice-reject-reason: request_timeout/);
  const body = JSON.parse(answer.slice(answer.indexOf('\r\n\r\n') + 4)) as {
    error: { code: string; message: string; type: string };
  };
  expect(body.error.code).toBe('request_timeout');
  expect(body.error.type).toBe('invalid_request_error');
  expect(body.error.message).toContain('GATEWAY_REQUEST_TIMEOUT_SECONDS (1 s)');
}

describe('slow or silent requests', () => {
  it('times out a body that stops after 10 of 1000 bytes with 408, holding nothing', async () => {
    const { answer } = openAndSend(
      'POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n' +
        'content-length: 1000\r\n\r\n{"model":"',
    );
    const text = await answer;
    expect(text).not.toBe('');
    expect408(text);
    expect(await metric('sluice_held_requests ')).toBe('sluice_held_requests 0');
    expect(await metric('sluice_rejected_total{model="unknown",reason="request_timeout"}')).toBe(
      'sluice_rejected_total{model="unknown",reason="request_timeout"} 1',
    );
  });

  it('times out headers that never end', async () => {
    const { answer } = openAndSend('POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n');
    expect408(await answer);
  });

  it('times out a connection that sends nothing', async () => {
    const { answer } = openAndSend('');
    expect408(await answer);
  });

  it('does not time out an answer that takes longer than the request timeout', async () => {
    for (const stream of [false, true]) {
      const res = await fetch(`${gateway.url}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({
          model: 'm',
          messages: [{ role: 'user', content: 'slow' }],
          max_tokens: 10,
          stream,
        }),
      });
      expect(res.status).toBe(200);
      const text = await res.text();
      if (stream) expect(text).toMatch(/data: \[DONE\]\n\n$/);
      else expect((JSON.parse(text) as { object: string }).object).toBe('chat.completion');
    }
    await eventually(
      async () => (await metric('sluice_held_requests ')) === 'sluice_held_requests 0',
      'nothing held',
    );
  });
});
