// A pass-through stream ended by a shutdown, between real sockets: the client gets the whole
// events the backend sent, then the in-band `shutting_down` error (never glued to a half
// event), and the request counts as the gateway's `shutting_down`, not the client's
// `cancelled`.
import { once } from 'node:events';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { sseErrorEnd } from '@sluice/openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Passthrough, type PassthroughAnswer } from '../src/passthrough.ts';
import { refusal } from '../src/refuse.ts';

let backend: Server;
let edge: Server;
let backendUrl: string;
let edgeUrl: string;
const passthrough = new Passthrough(false);
let answered: Promise<PassthroughAnswer> | undefined;

const listen = async (server: Server) => {
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
};

beforeAll(async () => {
  backend = createServer((req, res) => {
    req.resume();
    res.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8' });
    // One whole event and half of the next; then nothing, as a long generation would.
    res.write('data: {"n":1}\n\ndata: {"n"');
  });
  edge = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      answered = passthrough.forward(
        { url: backendUrl },
        '/v1/chat/completions',
        req.headers,
        Buffer.concat(chunks),
        res,
      );
    });
  });
  [backendUrl, edgeUrl] = await Promise.all([listen(backend), listen(edge)]);
});

afterAll(async () => {
  backend.closeAllConnections();
  edge.closeAllConnections();
  await passthrough.close();
  backend.close();
  edge.close();
});

describe('pass-through drain', () => {
  it('ends a stream in progress with the in-band error after its last whole event', async () => {
    const res = await fetch(`${edgeUrl}/`, { method: 'POST', body: '{"stream":true}' });
    const reader = res.body!.getReader();
    const decoder = new TextDecoder();
    let text = '';
    while (!text.includes('\n\n')) text += decoder.decode((await reader.read()).value);
    expect(passthrough.size).toBe(1);

    const r = refusal('shutting_down', 'this gateway replica is shutting down');
    expect(passthrough.cutAll(r)).toBe(1);
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      text += decoder.decode(value);
    }
    expect(text).toBe(`data: {"n":1}\n\n${sseErrorEnd(r.message, r.type, r.reason)}`);
    expect(await answered).toEqual({ status: 503, reason: 'shutting_down' });
    await passthrough.whenIdle();
    expect(passthrough.size).toBe(0);
  });
});
