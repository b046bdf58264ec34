// The in-flight ledger over jobs taken from a real BullMQ queue on a real redis-server:
// the only place the per-engine counts change, exact between awaits, idempotent on end.
import { dispatcherMetrics, Registry } from '@sluice/observability';
import { keySpace, type JobPayload } from '@sluice/protocol';
import { createRedis, redisReady, type Redis } from '@sluice/redis';
import { startRedis, type TestRedis } from '@sluice/test/support';
import { Queue, Worker, type Job } from 'bullmq';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createEngineSlot, type EngineSlot } from '../src/engine-slot.ts';
import { InflightLedger, STREAM_TRANSIT_MS } from '../src/ledger.ts';
import { PrefillRate } from '../src/prefill-tracker.ts';

let server: TestRedis;
let redis: Redis;
let queue: Queue;
let worker: Worker;
const keys = keySpace('ledger-test');

beforeAll(async () => {
  server = await startRedis();
  redis = createRedis(server.url, { name: 'test', role: 'bullmq' });
  await redisReady(redis);
  queue = new Queue('pool-p', { connection: redis, prefix: keys.prefix });
  worker = new Worker('pool-p', null, { connection: redis, prefix: keys.prefix, autorun: false });
  await worker.waitUntilReady();
});
afterAll(async () => {
  await worker.close(true);
  await queue.close();
  await redis.quit();
  await server.stop();
});

const payload = (promptTokens = 10): JobPayload => ({
  v: 1,
  body: '{}',
  path: '/v1/chat/completions',
  stream: true,
  replica: 'r1',
  enqueuedAt: Date.now(),
  deadline: Date.now() + 60_000,
  priority: 0,
  promptTokens,
});

let tokens = 0;
async function take(data: JobPayload): Promise<{ job: Job; token: string }> {
  await queue.add('job', data);
  const token = `t${(tokens += 1)}`;
  const job = await worker.getNextJob(token, { block: false });
  if (!job) throw new Error('no job taken');
  return { job, token };
}

function setup() {
  const registry = new Registry();
  const metrics = dispatcherMetrics(registry);
  const engine = (name: string): EngineSlot =>
    createEngineSlot(
      { name, url: 'http://127.0.0.1:9', maxInflight: 4, capSource: 'config', lane: 'any' },
      {
        timeouts: { headersTimeoutMs: 1000, bodyTimeoutMs: 1000 },
        scrape: { intervalMs: 1000, staleAfterFailures: 3 },
        now: Date.now,
      },
    );
  let changes = 0;
  const ledger = new InflightLedger({
    pool: 'p',
    metrics,
    prefillRate: new PrefillRate(),
    now: Date.now,
    changed: () => (changes += 1),
  });
  const gauge = async (engineName: string, of = metrics.inflight) =>
    (await of.get()).values.find((v) => v.labels['engine'] === engineName)?.value;
  return { ledger, engine, gauge, metrics, changes: () => changes };
}

describe('in-flight ledger', () => {
  it('counts a job on its engine at begin and uncounts it once at complete, with the metric', async () => {
    const { ledger, engine, gauge, changes } = setup();
    const a = engine('a');
    const b = engine('b');
    const first = await take(payload());
    const second = await take(payload());
    const e1 = ledger.begin(first.job, first.token, a, payload(), false);
    const e2 = ledger.begin(second.job, second.token, b, payload(), false);
    expect([a.inflight, b.inflight, ledger.size]).toEqual([1, 1, 2]);
    expect(await gauge('a')).toBe(1);
    expect(ledger.get(first.job.id!)).toBe(e1);

    const before = changes();
    ledger.complete(e1);
    expect([a.inflight, b.inflight, ledger.size]).toEqual([0, 1, 1]);
    expect(await gauge('a')).toBe(0);
    expect(changes()).toBeGreaterThan(before);

    // A second completion (a run that ended twice) changes nothing.
    ledger.complete(e1);
    expect([a.inflight, ledger.size]).toEqual([0, 1]);
    ledger.complete(e2);
    expect([b.inflight, ledger.size]).toEqual([0, 0]);
    expect([...ledger.values()]).toEqual([]);
  });

  it('tracks a long prompt in flight and in prefill until its first byte and its end', async () => {
    const { ledger, engine, gauge, metrics } = setup();
    const a = engine('a');
    const longGauges = async () => [
      await gauge('a', metrics.longInflight),
      await gauge('a', metrics.longInPrefill),
    ];
    const taken = await take(payload(50_000));
    const entry = ledger.begin(taken.job, taken.token, a, payload(50_000), true);
    expect([a.longInflight, a.longInPrefill]).toEqual([1, 1]);
    expect(await longGauges()).toEqual([1, 1]);
    // Two seconds of prefill: a measurable rate, whatever the clock read at release.
    entry.work.firstByte(Date.now() + 2000, 200);
    expect([a.longInflight, a.longInPrefill]).toEqual([1, 0]);
    expect(await longGauges()).toEqual([1, 0]);
    // The stream's first byte measured the prefill rate: the pool's gauge shows it.
    expect((await metrics.prefillRate.get()).values[0]?.value).toBeGreaterThan(0);
    ledger.complete(entry);
    expect([a.longInflight, a.inflight]).toEqual([0, 0]);
    expect([...(await longGauges()), await gauge('a')]).toEqual([0, 0, 0]);
  });

  it('ignores the completion of an entry a newer run of the same job replaced', async () => {
    const { ledger, engine } = setup();
    const a = engine('a');
    const taken = await take(payload());
    const old = ledger.begin(taken.job, taken.token, a, payload(), false);
    ledger.complete(old);
    const again = ledger.begin(taken.job, taken.token, a, payload(), false);
    ledger.complete(old);
    expect(ledger.get(taken.job.id!)).toBe(again);
    expect(a.inflight).toBe(1);
    ledger.complete(again);
    expect(a.inflight).toBe(0);
  });
});

describe('what a scrape can have seen', () => {
  it('counts only the requests already handed to the engine when the scrape was sent', async () => {
    const { ledger, engine } = setup();
    const a = engine('a');
    const b = engine('b');
    const begin = async (on: EngineSlot) => {
      const { job, token } = await take(payload());
      // Non-streaming: counted once handed over (streams: the next test).
      return ledger.begin(job, token, on, { ...payload(), stream: false }, false);
    };
    const first = await begin(a);
    const second = await begin(a);
    const other = await begin(b);
    // Released, but still in the runner's own checks: in flight for the cap, not on the engine.
    expect(ledger.onEngineBy(a, 1_000)).toBe(0);
    first.callStartedAt = 900;
    second.callStartedAt = 1_100;
    other.callStartedAt = 500;
    expect(ledger.onEngineBy(a, 1_000)).toBe(1);
    expect(ledger.onEngineBy(a, 1_100)).toBe(2);
    expect(ledger.onEngineBy(b, 1_000)).toBe(1);
    ledger.complete(first);
    expect(ledger.onEngineBy(a, 2_000)).toBe(1);
    ledger.complete(second);
    ledger.complete(other);
  });

  it('counts a stream once its first byte came before the scrape, or once it had time to arrive', async () => {
    const { ledger, engine } = setup();
    const a = engine('a');
    const { job, token } = await take(payload());
    const stream = ledger.begin(job, token, a, { ...payload(), stream: true }, false);
    stream.callStartedAt = 10_000;
    // Handed over, but the scrape may have overtaken it on the way to the engine.
    expect(ledger.onEngineBy(a, 10_500)).toBe(0);
    stream.firstByteAt = 10_400;
    expect(ledger.onEngineBy(a, 10_300)).toBe(0);
    expect(ledger.onEngineBy(a, 10_400)).toBe(1);
    stream.firstByteAt = undefined; // a long prefill: no byte yet
    expect(ledger.onEngineBy(a, 10_000 + STREAM_TRANSIT_MS - 1)).toBe(0);
    expect(ledger.onEngineBy(a, 10_000 + STREAM_TRANSIT_MS)).toBe(1);
    // A non-streaming request shows nothing before its end: it counts once handed over.
    const other = await take(payload());
    const plain = ledger.begin(other.job, other.token, a, { ...payload(), stream: false }, false);
    plain.callStartedAt = 10_000;
    expect(ledger.onEngineBy(a, 10_000)).toBe(1);
    ledger.complete(stream);
    ledger.complete(plain);
  });
});
