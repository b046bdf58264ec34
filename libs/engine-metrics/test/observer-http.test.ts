// The observer against a small real HTTP server of the test's own, for what the
// simulator cannot be made to do: a closed port, garbage, a held request, a path prefix.
import { once } from 'node:events';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { freePort } from '@sluice/test/support';
import { afterEach, describe, expect, it } from 'vitest';
import type { EngineObserver, EngineObserverOptions } from '../src/index.js';
import { createEngineObserver } from '../src/index.js';
import { readFixture } from './helpers.js';
import { recordChanges, stateWhere } from './observer-helpers.js';

const V1 = readFixture('vllm-v1-engine.prom');

type Handler = (req: IncomingMessage, res: ServerResponse) => void;

const servers: Server[] = [];
const observers: EngineObserver[] = [];

async function serve(handler: Handler): Promise<{ url: string; server: Server }> {
  const server = createServer(handler);
  servers.push(server);
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, server };
}

function observe(options: Partial<EngineObserverOptions> & { url: string }): EngineObserver {
  const observer = createEngineObserver({
    name: 'stub',
    intervalMs: 10,
    // Generous, so a busy machine does not turn a test about something else into a timeout.
    timeoutMs: 5_000,
    staleAfterFailures: 3,
    ...options,
  });
  observers.push(observer);
  return observer;
}

function answer(status: number, body: string): Handler {
  return (_req, res) => res.writeHead(status, { 'content-type': 'text/plain' }).end(body);
}

afterEach(async () => {
  await Promise.all(observers.splice(0).map((o) => o.stop()));
  for (const server of servers.splice(0)) {
    server.closeAllConnections();
    server.close();
  }
});

describe('EngineObserver over HTTP', () => {
  it('GETs <base path>/metrics with the API key, one request at a time on one kept-alive connection', async () => {
    const seen: { url?: string; auth?: string; accept?: string }[] = [];
    let open = 0;
    let maxOpen = 0;
    let connections = 0;
    const { url, server } = await serve((req, res) => {
      seen.push({ url: req.url, auth: req.headers.authorization, accept: req.headers.accept });
      maxOpen = Math.max(maxOpen, ++open);
      // Each scrape takes longer than the 1 ms interval.
      setTimeout(() => {
        open--;
        res.writeHead(200, { 'content-type': 'text/plain; version=0.0.4' }).end(V1);
      }, 3);
    });
    server.on('connection', () => connections++);

    const observer = observe({
      url: `${url}/engine-a/`,
      apiKey: 'sk-test',
      intervalMs: 1,
      timeoutMs: 5_000,
    });
    const changes = recordChanges(observer);
    await observer.start();
    expect(observer.state.lastError).toBeUndefined();
    expect(observer.state.vllm).toMatchObject({ running: 12, waiting: 3, ranks: 1 });
    await stateWhere(observer, () => changes.length >= 30, 'thirty scrapes');

    expect(maxOpen).toBe(1);
    expect(connections).toBe(1);
    expect(seen[0]).toEqual({
      url: '/engine-a/metrics',
      auth: 'Bearer sk-test',
      accept: expect.stringContaining('text/plain'),
    });
    expect(new Set(seen.map((s) => s.url))).toEqual(new Set(['/engine-a/metrics']));
    // One request per scrape: no retries hidden behind an event.
    expect(seen.length).toBeGreaterThanOrEqual(changes.length);
    expect(seen.length).toBeLessThanOrEqual(changes.length + 1);
  });

  it('sends no Authorization header without an API key', async () => {
    let auth: string | undefined = 'unset';
    const { url } = await serve((req, res) => {
      auth = req.headers.authorization;
      answer(200, V1)(req, res);
    });
    await observe({ url }).start();
    expect(auth).toBeUndefined();
  });

  it('resolves start() on a closed port, then goes unknown -> stale (counted as a transition)', async () => {
    const url = `http://127.0.0.1:${await freePort()}`;
    const observer = observe({ url, staleAfterFailures: 2 });
    await observer.start();
    expect(observer.state).toMatchObject({
      health: 'unknown',
      consecutiveFailures: 1,
      degraded: false,
      staleTransitions: 0,
    });
    expect(observer.state.lastError).toMatch(new RegExp(`^GET ${url}/metrics: .*ECONNREFUSED`));
    const stale = await stateWhere(observer, (s) => s.health === 'stale', 'stale');
    expect(stale).toMatchObject({ consecutiveFailures: 2, staleTransitions: 1 });
    expect(stale.vllm).toBeUndefined();
    expect(stale.scrapedAt).toBeUndefined();
  });

  it('clears degraded once a not-vLLM endpoint stops answering (connection refused)', async () => {
    const { url, server } = await serve(answer(200, 'other_metric 1\n'));
    const observer = observe({ url, staleAfterFailures: 100 });
    await observer.start();
    expect(observer.state).toMatchObject({ degraded: true, consecutiveFailures: 1 });
    server.closeAllConnections();
    server.close();
    const refused = await stateWhere(
      observer,
      (s) => /ECONNREFUSED/.test(s.lastError ?? ''),
      'connection refused',
    );
    expect(refused).toMatchObject({ degraded: false, health: 'unknown' });
    expect(refused.consecutiveFailures).toBeGreaterThan(1);
  });

  it('counts a parse error as a failure, not as degraded, and names the line', async () => {
    const { url } = await serve(answer(200, 'vllm:num_requests_running 1\nvllm:kv{ 2\n'));
    const observer = observe({ url, staleAfterFailures: 1 });
    await observer.start();
    expect(observer.state).toMatchObject({
      health: 'stale',
      degraded: false,
      consecutiveFailures: 1,
      staleTransitions: 1,
    });
    expect(observer.state.lastError).toMatch(/\/metrics: bad exposition: line 2: /);
  });

  it('counts an impossible gauge value as a failure, not as degraded', async () => {
    const { url } = await serve(
      answer(200, V1.replace(/(num_requests_running\{.*\}) 12\.0/, '$1 NaN')),
    );
    const observer = observe({ url });
    await observer.start();
    expect(observer.state).toMatchObject({ health: 'unknown', degraded: false });
    expect(observer.state.lastError).toMatch(/vllm:num_requests_running\{.*\} is NaN/);
  });

  it('counts a status other than 200 as a failure and keeps credentials out of lastError', async () => {
    const { url } = await serve(answer(404, 'not found'));
    const withCredentials = url.replace('http://', 'http://admin:hunter2@');
    const observer = observe({ url: withCredentials });
    await observer.start();
    expect(observer.state.lastError).toBe(`GET ${url}/metrics: HTTP 404`);
  });

  it('stop() aborts a scrape in flight and emits nothing for it', async () => {
    let held: IncomingMessage | undefined;
    let arrive!: () => void;
    const arrived = new Promise<void>((resolve) => (arrive = resolve));
    let first = true;
    const { url } = await serve((req, res) => {
      if (first) {
        first = false;
        return answer(200, V1)(req, res);
      }
      held = req; // never answered
      arrive();
    });
    const observer = observe({ url, intervalMs: 1 });
    await observer.start();
    await arrived;
    const changes = recordChanges(observer);
    const closed = once(held!.socket, 'close');
    await observer.stop();
    await closed;
    expect(changes).toEqual([]);
    expect(observer.state.health).toBe('healthy');
  });
});

describe('createEngineObserver options', () => {
  const base = { name: 'e', url: 'http://127.0.0.1:1', intervalMs: 500, staleAfterFailures: 3 };

  it.each([
    [{ url: 'not a url' }, /url must be an absolute http\(s\) URL, got "not a url"/],
    [{ url: 'ftp://host/' }, /url must be an absolute http\(s\) URL/],
    [{ name: '' }, /name must be a non-empty string/],
    [{ intervalMs: 0 }, /intervalMs must be an integer >= 1, got 0/],
    [{ intervalMs: 1.5 }, /intervalMs must be an integer >= 1, got 1.5/],
    [{ staleAfterFailures: 0 }, /staleAfterFailures must be an integer >= 1, got 0/],
    [{ timeoutMs: -1 }, /timeoutMs must be an integer >= 1, got -1/],
  ])('rejects %j', (patch, message) => {
    expect(() => createEngineObserver({ ...base, ...patch })).toThrow(message);
  });

  it('starts in the unknown state', () => {
    const observer = createEngineObserver(base);
    observers.push(observer);
    expect(observer.state).toEqual({
      name: 'e',
      health: 'unknown',
      consecutiveFailures: 0,
      degraded: false,
      staleTransitions: 0,
    });
  });
});
