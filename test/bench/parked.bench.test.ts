// Waiting at scale: 10,000 streaming clients parked on one gateway replica while one endless
// stream holds the only engine slot. The gateway's resident memory, its event-loop delay p99
// and whether every client kept getting its keep-alive on time.
import { readFileSync } from 'node:fs';
import { connect, type Socket } from 'node:net';
import { performance } from 'node:perf_hooks';
import { setTimeout as delay } from 'node:timers/promises';
import { afterAll, beforeAll, expect, it } from 'vitest';
import {
  eventually,
  startStack,
  type SluiceProcess,
  type Stack,
  type TestEngineSim,
} from '../support/index.ts';
import { residentBytes, round, writeResult, type Figure, type Series } from './results.ts';

const WANTED = 10_000;
const HEARTBEAT_SECONDS = 1;
const WINDOW_PERIODS = 5;
/** Sockets opened together; more would overflow the listen backlog and wait for SYN retries. */
const BATCH = 200;
const KEEPALIVE = ': keep-alive';

/** Open-file limit of this process (the gateway inherits it): each side holds one fd per client. */
const fdLimit = Number(
  /^Max open files\s+(\d+)/m.exec(readFileSync('/proc/self/limits', 'utf8'))?.[1] ?? Infinity,
);
const CLIENTS = Math.min(WANTED, fdLimit - 500);

let stack: Stack;
let sim: TestEngineSim;
let gateway: SluiceProcess;
const sockets: Socket[] = [];
const blocker = new AbortController();

beforeAll(async () => {
  // 20 tokens/s: the blocker's 100,000 tokens outlast the scenario many times over.
  stack = await startStack({
    keepGatewayOutput: false,
    sim: ['--decode-seconds-per-sequence', '0.05'],
    env: {
      ADMISSION_MAX_INFLIGHT: '1',
      VLLM_MAX_QUEUE_DEPTH: '20000',
      SSE_HEARTBEAT_SECONDS: String(HEARTBEAT_SECONDS),
      ADMISSION_MAX_PARK_SECONDS: '600',
    },
  });
  ({ sim, gateway } = stack);
});

afterAll(async () => {
  // Nothing is measured any more: kill the broker rather than let it dequeue every client and
  // wait for the blocker's job.
  await Promise.all(
    [...(stack?.gateways ?? []), ...(stack?.dispatchers ?? [])].map((p) => p.stop('SIGKILL')),
  );
  blocker.abort();
  for (const socket of sockets) socket.destroy();
  await stack?.stop();
});

/** A client's keep-alives: how many so far, when the last came, the longest gap between two. */
interface Client {
  socket: Socket;
  count: number;
  last: number;
  longestGap: number;
  closed: boolean;
}

/** Opens one parked streaming request on a raw socket and counts its keep-alives. */
function park(port: number, i: number): Promise<Client> {
  const body = JSON.stringify({
    model: 'm',
    messages: [{ role: 'user', content: `waiting client ${i}` }],
    max_tokens: 4,
    stream: true,
  });
  return new Promise((resolve, reject) => {
    const socket = connect(port, '127.0.0.1');
    sockets.push(socket);
    const client: Client = { socket, count: 0, last: 0, longestGap: 0, closed: false };
    let tail = '';
    socket.setEncoding('utf8');
    socket.on('data', (data: string) => {
      const text = tail + data;
      // Keep less than one marker, so that a marker split across reads is counted once.
      tail = text.slice(-(KEEPALIVE.length - 1));
      const now = performance.now();
      for (let at = text.indexOf(KEEPALIVE); at !== -1; at = text.indexOf(KEEPALIVE, at + 1)) {
        if (client.count > 0) client.longestGap = Math.max(client.longestGap, now - client.last);
        client.count += 1;
        client.last = now;
      }
    });
    socket.on('close', () => (client.closed = true));
    socket.once('error', reject);
    socket.once('connect', () => {
      socket.write(
        `POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\n` +
          `Content-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`,
      );
      resolve(client);
    });
  });
}

/** Opens every client, `BATCH` at a time. */
async function openAll(port: number): Promise<Client[]> {
  const clients: Client[] = [];
  for (let i = 0; i < CLIENTS; i += BATCH) {
    const batch = Array.from({ length: Math.min(BATCH, CLIENTS - i) }, (_, k) => park(port, i + k));
    clients.push(...(await Promise.all(batch)));
  }
  return clients;
}

async function gatewayMetrics(): Promise<string> {
  return (await fetch(`${gateway.url}/metrics`)).text();
}

/** The value of one gauge in Prometheus text (summed over its label sets). */
function gauge(text: string, name: string): number {
  const lines = text
    .split('\n')
    .filter((l) => l.startsWith(`${name}{`) || l.startsWith(`${name} `));
  return lines.reduce((sum, line) => sum + Number(line.slice(line.lastIndexOf(' ') + 1)), 0);
}

it(`parks ${WANTED} streaming clients on one gateway replica`, async () => {
  const pid = gateway.process.child.pid!;
  const port = Number(new URL(gateway.url).port);
  const idleRss = residentBytes(pid);

  // One endless stream holds the only slot.
  const held = await fetch(`${gateway.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({
      model: 'm',
      messages: [{ role: 'user', content: 'blocker' }],
      max_tokens: 100_000,
      ignore_eos: true,
      stream: true,
    }),
    signal: blocker.signal,
  });
  void held.body!.pipeTo(new WritableStream()).catch(() => {});
  await eventually(
    async () => (await sim.state()).running === 1 || undefined,
    'the blocker to run',
  );

  // Open every client, a batch at a time, while sampling until the gateway reports them all
  // parked. The gauge is polled: the gateway reports, it does not notify.
  const opening = performance.now();
  const since = () => round((performance.now() - opening) / 1000, 1);
  const rss: Array<[number, number]> = [];
  const parked: Array<[number, number]> = [];
  const opened = openAll(port);
  for (;;) {
    const now = gauge(await gatewayMetrics(), 'sluice_parked_requests');
    rss.push([since(), residentBytes(pid)]);
    parked.push([since(), now]);
    if (now >= CLIENTS) break;
    expect(since(), `${now} of ${CLIENTS} parked`).toBeLessThan(120);
    await delay(250);
  }
  const secondsToPark = since();
  const clients = await opened;

  // The window. The scrape before it resets the event-loop histogram, so the one after covers
  // exactly the window; in between only memory is sampled. A timed window is the measurement.
  await gatewayMetrics();
  const start = clients.map((c) => c.count);
  for (const c of clients) c.longestGap = 0;
  const windowStart = performance.now();
  const windowRss: number[] = [];
  while (performance.now() - windowStart < WINDOW_PERIODS * HEARTBEAT_SECONDS * 1000) {
    await delay(250);
    windowRss.push(residentBytes(pid));
    rss.push([since(), windowRss.at(-1)!]);
  }
  const window = (performance.now() - windowStart) / 1000;
  const received = clients.map((c, i) => c.count - start[i]!);
  const metrics = await gatewayMetrics();
  const lagP99 = gauge(metrics, 'sluice_gateway_nodejs_eventloop_lag_p99_seconds') * 1000;
  const lagMax = gauge(metrics, 'sluice_gateway_nodejs_eventloop_lag_max_seconds') * 1000;
  const peakRss = Math.max(...windowRss);
  const expected = Math.floor(window / HEARTBEAT_SECONDS) - 1;
  const late = received.filter((n) => n < expected).length;
  const longestGap = Math.max(...clients.map((c) => c.longestGap)) / 1000;
  expect(
    clients.filter((c) => c.closed),
    'clients the gateway dropped',
  ).toHaveLength(0);
  expect(gauge(metrics, 'sluice_parked_requests')).toBe(CLIENTS);

  const figures: Figure[] = [
    {
      name: 'parked clients',
      value: CLIENTS,
      unit: 'clients',
      goal: `${WANTED}`,
      met: CLIENTS >= WANTED,
    },
    { name: 'time to open and park every client', value: round(secondsToPark, 1), unit: 's' },
    { name: 'gateway resident memory, idle', value: round(idleRss / 2 ** 20, 1), unit: 'MiB' },
    {
      name: 'gateway resident memory, clients parked (peak in the window)',
      value: round(peakRss / 2 ** 20, 1),
      unit: 'MiB',
    },
    {
      name: 'gateway memory per parked client',
      value: round((peakRss - idleRss) / CLIENTS / 1024, 1),
      unit: 'KiB',
    },
    { name: 'gateway event-loop delay p99', value: round(lagP99, 1), unit: 'ms' },
    { name: 'gateway event-loop delay max', value: round(lagMax, 1), unit: 'ms' },
    {
      name: 'fewest keep-alives a client got in the window',
      value: Math.min(...received),
      unit: 'keep-alives',
      goal: `>= ${expected}`,
      met: late === 0,
    },
    {
      name: 'clients with fewer keep-alives than expected',
      value: late,
      unit: 'clients',
      goal: '0',
      met: late === 0,
    },
    {
      name: 'longest gap between keep-alives at any client',
      value: round(longestGap, 2),
      unit: 's',
      note: `in the window; heartbeat period ${HEARTBEAT_SECONDS} s`,
    },
  ];
  const series: Series[] = [
    {
      name: 'gateway resident memory',
      unit: 'MiB',
      points: rss.map(([s, v]) => [s, round(v / 2 ** 20, 1)]),
    },
    { name: 'parked clients', unit: 'clients', points: parked },
  ];
  const notes = [
    `${CLIENTS} raw-socket clients, each one streaming chat request, opened ${BATCH} at a time against one gateway; cap 1 held by one endless stream; SSE_HEARTBEAT_SECONDS ${HEARTBEAT_SECONDS}. Window: ${round(window, 1)} s after the gateway reported all clients parked; each client should get at least ${expected} keep-alives in it.`,
    'Event-loop delay: prom-client default metrics of the gateway (monitorEventLoopDelay, 10 ms sampling), scraped at the start and the end of the window (each scrape resets the histogram).',
    `Open-file limit (ulimit -n) here: ${fdLimit}; the client process and the gateway each hold one descriptor per client.`,
  ];
  if (CLIENTS < WANTED)
    notes.push(
      `Only ${CLIENTS} clients fit under the open-file limit of ${fdLimit}; raise ulimit -n to about ${WANTED + 1000} for the full ${WANTED}.`,
    );
  writeResult({
    scenario: 'parked',
    title: `Waiting at scale: ${CLIENTS} parked streaming clients on one gateway`,
    figures,
    series,
    notes,
  });
});
