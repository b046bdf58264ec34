// A pass-through request between real sockets: a backend that records what it got, and a
// client-facing server whose response Passthrough writes. The backend's streams come as vLLM's
// do: the head at once, the first event after the prefill.
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
/** Short time-outs: 2 s to the first byte after the head, 0.1 s between chunks after it. */
const impatient = new Passthrough(false, { headersTimeoutMs: 2000, bodyTimeoutMs: 100 });
/** As `impatient`, for tenants who may not see a backend's address. */
const impatientHidden = new Passthrough(
  true,
  { headersTimeoutMs: 2000, bodyTimeoutMs: 100 },
  false,
);
/** A client that takes nothing for 0.2 s is cut. */
const stallShort = new Passthrough(false, {
  headersTimeoutMs: 900_000,
  bodyTimeoutMs: 300_000,
  slowClientStallMs: 200,
});
/** The one the client-facing server forwards with. */
let forwarder = passthrough;
/** Headers the backend got, per request. */
const received: IncomingHttpHeaders[] = [];
/** The backend's request sockets, once closed. */
const backendClosed: Promise<unknown>[] = [];
/**
 * What the next backend request answers: status; 'hang' (head sent, body never ends);
 * 'prefill' (a stream's head, then nothing: a prefill that never ends); 'slow-first' (a
 * stream's head, its first event after a prefill of half a second, then nothing).
 */
let backendAnswer: number | 'hang' | 'prefill' | 'slow-first' | 'flood' = 200;
let answered: Promise<PassthroughAnswer> | undefined;

const listen = async (server: Server) => {
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
};

beforeAll(async () => {
  backend = createServer((req, res) => {
    received.push(req.headers);
    // Not `once`, which rejects on the reset an aborted request's socket may see first.
    backendClosed.push(new Promise((resolve) => req.socket.once('close', resolve)));
    req.resume();
    if (backendAnswer === 'flood') {
      // An endless stream, written as fast as the gateway takes it.
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      const event = Buffer.from(`data: ${'x'.repeat(16 * 1024)}\n\n`);
      const more = () => {
        while (!res.destroyed && res.write(event));
        if (!res.destroyed) res.once('drain', more);
      };
      more();
      return;
    }
    if (backendAnswer === 'hang') {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write('data: first\n\n');
      return;
    }
    if (backendAnswer === 'prefill' || backendAnswer === 'slow-first') {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.flushHeaders();
      // The prefill: longer than the impatient body time-out, shorter than its headers one.
      if (backendAnswer === 'slow-first') setTimeout(() => res.write('data: first\n\n'), 500);
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
      answered = forwarder.forward(
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
  await impatient.close();
  await impatientHidden.close();
  await stallShort.close();
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

  it("cuts a client that stops reading past the stall limit as slow_client, and ends the backend's request", async () => {
    backendAnswer = 'flood';
    forwarder = stallShort;
    try {
      const res = await fetch(`${edgeUrl}/`, { method: 'POST', body: '{}' });
      expect(res.status).toBe(200);
      // The head read, the body never: the sockets fill and the gateway's writes wait.
      expect(await answered).toEqual({ status: 499, reason: 'slow_client' });
      await backendClosed.at(-1);
      await res.body?.cancel().catch(() => {});
    } finally {
      forwarder = passthrough;
    }
  });

  it("ends a stream whose first byte does not come within the headers time-out of its head in-band with engine_timeout, and closes the backend's connection", async () => {
    backendAnswer = 'prefill';
    forwarder = impatient;
    try {
      const res = await fetch(`${edgeUrl}/`, { method: 'POST', body: '{}' });
      expect(res.status).toBe(200);
      const text = await res.text();
      expect(text.startsWith('data: {"error":')).toBe(true);
      const error = JSON.parse(text.slice('data: '.length, text.indexOf('\n'))) as {
        error: { code: string; message: string };
      };
      expect(error.error.code).toBe('engine_timeout');
      expect(error.error.message).toBe(
        `backend ${backendUrl} sent no body within 2 s of its response head (ENGINE_HEADERS_TIMEOUT_MS; a stream's prefill must end within it)`,
      );
      expect(await answered).toEqual({ status: 504, reason: 'engine_timeout' });
      await backendClosed.at(-1);
    } finally {
      forwarder = passthrough;
    }
  });

  it("tells a tenant without engine details a fixed message, not the backend's address, and keeps the full one aside", async () => {
    backendAnswer = 'prefill';
    forwarder = impatientHidden;
    try {
      const res = await fetch(`${edgeUrl}/`, { method: 'POST', body: '{}' });
      const text = await res.text();
      expect(text).not.toContain(backendUrl);
      const error = JSON.parse(text.slice('data: '.length, text.indexOf('\n'))) as {
        error: { code: string; message: string };
      };
      expect(error.error).toMatchObject({
        code: 'engine_timeout',
        message: 'the engine took longer than the gateway waits for an answer',
      });
      expect(await answered).toEqual({
        status: 504,
        reason: 'engine_timeout',
        detail: expect.stringContaining(`backend ${backendUrl} sent no body within 2 s`),
      });
    } finally {
      forwarder = passthrough;
    }
  });

  it('waits for a first byte past the body time-out, then bounds the gaps after it by the body time-out', async () => {
    backendAnswer = 'slow-first';
    forwarder = impatient;
    try {
      const res = await fetch(`${edgeUrl}/`, { method: 'POST', body: '{}' });
      const text = await res.text();
      // The first event came after five body time-outs and went out whole.
      expect(text.startsWith('data: first\n\ndata: {"error":')).toBe(true);
      expect(text).toContain('"code":"engine_error"');
      expect(text).toContain(
        `backend ${backendUrl} failed mid-answer: nothing for 0.1 s after the last chunk (ENGINE_BODY_TIMEOUT_MS)`,
      );
      expect(await answered).toEqual({ status: 502, reason: 'engine_error' });
      await backendClosed.at(-1);
    } finally {
      forwarder = passthrough;
    }
  });
});
