// The connections of a draining replica, between real sockets: idle kept-alive connections
// close at the drain's start, every answer from then on says `Connection: close`, and an
// answer still flushing to a slow reader is not cut (Node counts its connection idle as soon
// as `end()` was called, and closeIdleConnections alone would destroy it).
import { once } from 'node:events';
import { createServer, type Server, type ServerResponse } from 'node:http';
import { connect, type Socket } from 'node:net';
import type { AddressInfo } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { DrainingConnections } from '../src/drain.ts';

const BIG = 64 * 1024 * 1024;

let server: Server | undefined;
const sockets: Socket[] = [];

afterEach(() => {
  for (const s of sockets.splice(0)) s.destroy();
  server?.closeAllConnections();
  server?.close();
  server = undefined;
});

async function start(handler: (url: string, res: ServerResponse) => void) {
  server = createServer((req, res) => handler(req.url ?? '', res));
  const connections = new DrainingConnections(server);
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  return { connections, port: (server.address() as AddressInfo).port };
}

async function open(port: number): Promise<Socket> {
  const socket = connect(port, '127.0.0.1');
  sockets.push(socket);
  socket.on('error', () => {});
  await once(socket, 'connect');
  return socket;
}

/** Everything the server sends until it closes the connection. */
function untilClosed(socket: Socket): Promise<Buffer> {
  const chunks: Buffer[] = [];
  socket.on('data', (c: Buffer) => chunks.push(c));
  return new Promise((resolve) => socket.once('close', () => resolve(Buffer.concat(chunks))));
}

describe('DrainingConnections', () => {
  it('lets an answer that is still flushing to a slow reader arrive whole, then closes its connection', async () => {
    let ended!: (res: ServerResponse) => void;
    const endedBig = new Promise<ServerResponse>((resolve) => (ended = resolve));
    const { connections, port } = await start((url, res) => {
      res.setHeader('content-length', String(BIG));
      res.end(Buffer.alloc(BIG, 'a'));
      ended(res);
    });
    const reader = await open(port);
    // Reads nothing yet: the answer backs up in the server.
    reader.pause();
    reader.write('GET /big HTTP/1.1\r\nhost: x\r\n\r\n');
    const res = await endedBig;
    expect(res.writableFinished).toBe(false);

    connections.start();
    const received = untilClosed(reader);
    reader.resume();
    const bytes = await received;
    const head = bytes.subarray(0, bytes.indexOf('\r\n\r\n') + 4).toString('latin1');
    expect(head).toContain('Connection: keep-alive');
    expect(bytes.length - head.length).toBe(BIG);
  });

  it('closes idle connections at once and answers new requests with Connection: close', async () => {
    const { connections, port } = await start((_url, res) => res.end('ok'));
    const idle = await open(port);
    idle.write('GET / HTTP/1.1\r\nhost: x\r\n\r\n');
    await once(idle, 'data');
    const idleClosed = untilClosed(idle);

    connections.start();
    await idleClosed;

    const late = await open(port);
    const answer = untilClosed(late);
    late.write('GET / HTTP/1.1\r\nhost: x\r\n\r\n');
    expect((await answer).toString('latin1')).toMatch(/^HTTP\/1\.1 200[^]*Connection: close\r\n/);
  });
});
