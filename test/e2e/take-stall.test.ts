// A leader whose BullMQ connections go silent while its command connection stays up: it keeps
// the lease and, without the take watchdog, takes nothing again (its take waits for good on a
// connection no command timeout bounds) while its clients wait to the park limit. The fault is
// real sockets going silent: the dispatcher reaches Redis through a TCP relay in this test,
// which stops passing bytes on those two connections (found by CLIENT LIST) and keeps them
// open, as a half-open connection does (a peer or a middlebox gone without a reset). New
// connections pass. The watchdog finds jobs waiting, the gate open and no take answered for
// its bound (BullMQ's longest block + one lease TTL), warns once, counts the episode and
// resets the connections; the queued request is then served, once.
import { createServer, connect, type Server, type Socket } from 'node:net';
import { afterAll, beforeAll, expect, it } from 'vitest';
import {
  answer,
  askNode,
  chat,
  metricSum,
  startDispatcher,
  startEngineSim,
  startGateway,
  startRedis,
  untilReady,
  type SluiceProcess,
  type TestEngineSim,
  type TestRedis,
} from '../support/index.ts';

/** A TCP relay to one port that can make a relayed connection go silent. */
interface Relay {
  readonly port: number;
  /** Stops passing bytes both ways on the connection Redis sees from `clientPort`; keeps it open. */
  silence(clientPort: number): void;
  /** The relay's ports toward Redis, one per relayed connection. */
  relayedPorts(): Set<number>;
  close(): Promise<void>;
}

async function startRelay(target: number): Promise<Relay> {
  // Keyed by the relay's own port toward Redis: what CLIENT LIST shows as the client's address.
  const pairs = new Map<number, { inbound: Socket; outbound: Socket }>();
  const sockets = new Set<Socket>();
  const server: Server = createServer({ allowHalfOpen: true }, (inbound) => {
    const outbound = connect({ host: '127.0.0.1', port: target, allowHalfOpen: true });
    for (const s of [inbound, outbound]) {
      sockets.add(s);
      s.on('error', () => {});
      s.on('close', () => sockets.delete(s));
    }
    outbound.on('connect', () => pairs.set(outbound.localPort!, { inbound, outbound }));
    inbound.pipe(outbound);
    outbound.pipe(inbound);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    port: (server.address() as { port: number }).port,
    silence(clientPort) {
      const pair = pairs.get(clientPort);
      if (!pair) throw new Error(`no relayed connection from port ${clientPort}`);
      pair.inbound.unpipe(pair.outbound);
      pair.outbound.unpipe(pair.inbound);
      pair.inbound.pause();
      pair.outbound.pause();
    },
    relayedPorts: () => new Set(pairs.keys()),
    async close() {
      for (const s of sockets) s.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

const ID = 'stalled';
let redis: TestRedis;
let relay: Relay;
let sim: TestEngineSim;
let dispatcher: SluiceProcess;
let gateway: SluiceProcess;

beforeAll(async () => {
  redis = await startRedis();
  relay = await startRelay(redis.port);
  sim = await startEngineSim(['--profile', 'instant', '--model', 'm']);
  const env = {
    VLLM_URL: sim.url,
    VLLM_MODEL: 'm',
    SLUICE_DEGRADATION: 'off',
    // The stall bound is BullMQ's longest block (11 s) + this TTL: 12 s.
    SLUICE_LEASE_TTL_MS: '1000',
    // Well past the bound: without the watchdog the request waits this long, then 503.
    ADMISSION_MAX_PARK_SECONDS: '90',
    NODE_OPTIONS: '--unhandled-rejections=strict',
  };
  dispatcher = await startDispatcher({
    ...env,
    REDIS_URL: `redis://127.0.0.1:${relay.port}`,
    SLUICE_DISPATCHER_ID: ID,
  });
  gateway = await startGateway({ ...env, REDIS_URL: redis.url });
  await untilReady(gateway);
}, 120_000);

afterAll(async () => {
  await gateway?.stop();
  await dispatcher?.stop('SIGKILL');
  await sim?.stop();
  await relay?.close();
  await redis?.stop();
});

/** Requests the engine has received so far. */
async function received(): Promise<string[]> {
  return ((await (await fetch(`${sim.url}/sim/received`)).json()) as { ids: string[] }).ids;
}

it("serves the queue again after the leader's BullMQ connections went silent: one warning, one count, nothing run twice", async () => {
  const first = await answer(chat(gateway.url, 'before', { max_tokens: 2 }));
  expect(first.status, first.body).toBe(200);
  expect((await metricSum(dispatcher.url, 'sluice_take_stalls_total')) ?? 0).toBe(0);

  // Only the dispatcher goes through the relay. Its command and cancel connections stay; the
  // others are BullMQ's: the shared one (`...:bullmq`) and the worker's blocking one (BullMQ
  // names it after the queue).
  const portOf = (line: string) => Number(/ addr=127\.0\.0\.1:(\d+)/.exec(line)?.[1]);
  const relayed = relay.relayedPorts();
  const bullmq = String(await askNode(redis.port, (r) => r.call('CLIENT', 'LIST')))
    .split('\n')
    .filter((line) => relayed.has(portOf(line)))
    .filter(
      (line) =>
        !line.includes(`name=sluice:dispatcher:${ID}:command `) &&
        !line.includes(`name=sluice:dispatcher:${ID}:cancel `),
    );
  expect(bullmq.some((line) => line.includes(`name=sluice:dispatcher:${ID}:bullmq `))).toBe(true);
  expect(bullmq.some((line) => /cmd=bzpopmin/.test(line))).toBe(true);
  for (const line of bullmq) relay.silence(portOf(line));

  const stalled = dispatcher.process.waitForLine(/"msg":"release loop stalled/, 120_000);
  stalled.catch(() => {}); // Awaited below, once the request has its answer.
  const before = (await received()).length;
  const after = await answer(chat(gateway.url, 'after the silence', { max_tokens: 2 }));
  expect(after.status, after.body).toBe(200);
  const warning = JSON.parse((await stalled).input!) as Record<string, unknown>;
  expect(warning).toMatchObject({ level: 40, pool: 'default', waiting: 1 });
  expect(warning['sharedConnection']).toBe('not answering: reset');
  expect((await metricSum(dispatcher.url, 'sluice_take_stalls_total')) ?? 0).toBe(1);
  // The dispatcher kept its lease throughout: nothing was handed over.
  expect(dispatcher.process.output.some((l) => l.includes('lease lost'))).toBe(false);
  const ids = (await received()).slice(before);
  expect(ids).toHaveLength(1);

  // The episode is over: the next request goes at once, with no second warning or count.
  const next = await answer(chat(gateway.url, 'next', { max_tokens: 2 }));
  expect(next.status).toBe(200);
  expect((await metricSum(dispatcher.url, 'sluice_take_stalls_total')) ?? 0).toBe(1);
  expect(dispatcher.process.output.filter((l) => l.includes('release loop stalled'))).toHaveLength(
    1,
  );
}, 180_000);
