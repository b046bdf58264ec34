// A pass-through request between real sockets: a backend that records what it got, and a
// client-facing server whose response Passthrough writes.
import { once } from 'node:events';
import {
  createServer,
  type IncomingHttpHeaders,
  type Server,
  type ServerResponse,
} from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Passthrough, type PassthroughAnswer } from '../src/passthrough.ts';
import { REQUEST_ID_HEADER } from '../src/request-id.ts';

let backend: Server;
let edge: Server;
let backendUrl: string;
let edgeUrl: string;
const passthrough = new Passthrough(false);
/** Headers the backend got, per request. */
const received: IncomingHttpHeaders[] = [];
/** What the next backend request answers: status, or 'hang' (head sent, body never ends). */
let backendAnswer: number | 'hang' = 200;
let answered: Promise<PassthroughAnswer> | undefined;

const listen = async (server: Server) => {
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
};

beforeAll(async () => {
  backend = createServer((req, res) => {
    received.push(req.headers);
    req.resume();
    if (backendAnswer === 'hang') {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write('data: first\n\n');
      return;
    }
    res.writeHead(backendAnswer, {
      'content-type': 'application/json',
      [REQUEST_ID_HEADER]: 'backend-own-id',
      // vLLM's own CORS answer (every origin by default): the gateway's policy answers instead.
      'access-control-allow-origin': '*',
      'access-control-allow-credentials': 'true',
      vary: 'Accept-Encoding',
    });
    res.end('{"ok":true}');
  });
  edge = createServer((req, res: ServerResponse) => {
    res.setHeader(REQUEST_ID_HEADER, 'edge-id-1');
    // As the gateway's CORS hook leaves it for a listed origin.
    res.setHeader('access-control-allow-origin', 'https://app.example');
    res.setHeader('vary', 'Origin');
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      answered = passthrough.forward(
        { url: backendUrl },
        '/v1/completions',
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

describe('pass-through', () => {
  it("sends the request id on, answers with it, not the backend's, and reports the status", async () => {
    backendAnswer = 418;
    const res = await fetch(`${edgeUrl}/`, { method: 'POST', body: '{}' });
    expect(res.status).toBe(418);
    expect(res.headers.get(REQUEST_ID_HEADER)).toBe('edge-id-1');
    // The gateway's CORS headers, not the backend's; both Vary values.
    expect(res.headers.get('access-control-allow-origin')).toBe('https://app.example');
    expect(res.headers.get('access-control-allow-credentials')).toBeNull();
    expect(res.headers.get('vary')).toBe('Origin, Accept-Encoding');
    expect(await res.text()).toBe('{"ok":true}');
    expect(received.at(-1)![REQUEST_ID_HEADER]).toBe('edge-id-1');
    expect(await answered).toEqual({ status: 418 });
  });

  it("sends the client's trace context and data-parallel rank on when well-formed, drops them when not", async () => {
    backendAnswer = 200;
    const traceparent = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01';
    const send = async (headers: Record<string, string>) => {
      const res = await fetch(`${edgeUrl}/`, { method: 'POST', headers, body: '{}' });
      await res.text();
      expect(await answered).toEqual({ status: 200 });
      return received.at(-1)!;
    };
    expect(
      await send({ traceparent, tracestate: 'congo=t61rcWkgMzE', 'x-data-parallel-rank': '2' }),
    ).toMatchObject({ traceparent, tracestate: 'congo=t61rcWkgMzE', 'x-data-parallel-rank': '2' });
    const dropped = await send({
      traceparent: `ff${traceparent.slice(2)}`,
      tracestate: 'congo=t61rcWkgMzE',
      'x-data-parallel-rank': 'two',
    });
    for (const name of ['traceparent', 'tracestate', 'x-data-parallel-rank'])
      expect(dropped).not.toHaveProperty(name);
  });

  it('reports 499 cancelled for a client that leaves mid-answer', async () => {
    backendAnswer = 'hang';
    const controller = new AbortController();
    const res = await fetch(`${edgeUrl}/`, {
      method: 'POST',
      body: '{}',
      signal: controller.signal,
    });
    const reader = res.body!.getReader();
    await reader.read();
    controller.abort();
    expect(await answered).toEqual({ status: 499, reason: 'cancelled' });
  });
});
