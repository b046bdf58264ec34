// The baseline of the incident bench: the design the reference PR replaced. Each gateway
// replica held a semaphore of 4 slots (internal/proxy/proxy.go:119) and queued the rest in
// memory; nothing coordinated the replicas, so three of them let 12 requests reach an engine
// whose --max-num-seqs is 4. This is that proxy, small: node:http in front, undici behind,
// FIFO, no limit on the queue, no refusals.
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { pipeline } from 'node:stream/promises';
import { Agent, request, type Dispatcher } from 'undici';

export interface SemaphoreProxy {
  readonly url: string;
  /** Requests waiting for a slot now. */
  readonly queued: number;
  /** Requests holding a slot now. */
  readonly inflight: number;
  /** Most requests that held a slot at once. */
  readonly peakInflight: number;
  close(): Promise<void>;
}

// Hop-by-hop headers (RFC 9110 7.6.1) and those undici sets from the body it is given.
const hopByHop = new Set([
  'connection',
  'keep-alive',
  'proxy-connection',
  'transfer-encoding',
  'upgrade',
  'te',
  'trailer',
  'host',
  'content-length',
]);

function forwardable(
  headers: Record<string, string | string[] | undefined>,
): Record<string, string | string[]> {
  const out: Record<string, string | string[]> = {};
  for (const [name, value] of Object.entries(headers))
    if (value !== undefined && !hopByHop.has(name.toLowerCase())) out[name] = value;
  return out;
}

async function readBody(req: IncomingMessage): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const chunk of req) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks);
}

/** A proxy to `upstream` (an origin) that lets `slots` requests through at once. */
export async function startSemaphoreProxy(upstream: string, slots = 4): Promise<SemaphoreProxy> {
  // No client-side timeouts: a queued request may wait as long as the engine makes it.
  const agent = new Agent({ headersTimeout: 0, bodyTimeout: 0 });
  const waiters: Array<() => void> = [];
  let inflight = 0;
  let peakInflight = 0;

  const take = () => {
    inflight += 1;
    peakInflight = Math.max(peakInflight, inflight);
  };
  const release = () => {
    inflight -= 1;
    const next = waiters.shift();
    if (next) {
      take();
      next();
    }
  };

  async function handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const body = await readBody(req);
    let gone = false;
    const abort = new AbortController();
    res.once('close', () => {
      if (!res.writableFinished) {
        gone = true;
        abort.abort();
      }
    });
    // Acquire: a slot now, or a place at the back of the queue.
    if (inflight < slots) take();
    else {
      const granted = await new Promise<boolean>((resolve) => {
        const waiter = () => resolve(true);
        waiters.push(waiter);
        res.once('close', () => {
          const at = waiters.indexOf(waiter);
          if (at === -1) return;
          waiters.splice(at, 1); // left while queued: it never took a slot
          resolve(false);
        });
      });
      if (!granted) return;
    }
    if (gone) return release();
    try {
      const upstreamRes = await request(new URL(req.url ?? '/', upstream), {
        method: (req.method ?? 'GET') as Dispatcher.HttpMethod,
        headers: forwardable(req.headers),
        body: body.length > 0 ? body : null,
        dispatcher: agent,
        signal: abort.signal,
      });
      res.writeHead(upstreamRes.statusCode, forwardable(upstreamRes.headers));
      res.flushHeaders();
      await pipeline(upstreamRes.body, res);
    } catch {
      if (!res.headersSent && !gone) {
        res.writeHead(502, { 'content-type': 'application/json' });
        res.end('{"error":{"message":"upstream failed","type":"bad_gateway"}}');
      } else res.destroy();
    } finally {
      release();
    }
  }

  const server = createServer((req, res) => void handle(req, res));
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    get queued() {
      return waiters.length;
    },
    get inflight() {
      return inflight;
    },
    get peakInflight() {
      return peakInflight;
    },
    async close() {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
      await agent.close();
    },
  };
}
