// The lock renewal over jobs taken from a real BullMQ queue on a real redis-server: it
// extends the locks of the jobs in flight, tells a lost one once, and never takes a job whose
// outcome already went to BullMQ (its lock went with it) for lost.
import { dispatcherMetrics, Registry } from '@sluice/observability';
import type { JobPayload } from '@sluice/protocol';
import type { Job } from 'bullmq';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createEngineSlot } from '../src/engine-slot.ts';
import { recordOutcome } from '../src/handover.ts';
import { InflightLedger, type InflightJob } from '../src/ledger.ts';
import { LockRenewal } from '../src/lock-renewal.ts';
import { PrefillRate } from '../src/prefill-tracker.ts';
import { startQueueFixture, type QueueFixture } from './queue-fixture.ts';

const LOCK_MS = 60_000;

let fx: QueueFixture;
beforeAll(async () => {
  fx = await startQueueFixture('lock-renewal-test');
});
afterAll(async () => {
  await fx?.close();
});

const engine = createEngineSlot(
  { name: 'a', url: 'http://127.0.0.1:9', maxInflight: 4, capSource: 'config', lane: 'any' },
  {
    timeouts: { headersTimeoutMs: 1000, bodyTimeoutMs: 1000 },
    scrape: { intervalMs: 1000, staleAfterFailures: 3 },
    now: Date.now,
  },
);

const payload = (): JobPayload => ({
  v: 1,
  body: '{}',
  path: '/v1/chat/completions',
  stream: false,
  replica: 'r1',
  enqueuedAt: Date.now(),
  deadline: Date.now() + 60_000,
  priority: 0,
});

function setup() {
  const ledger = new InflightLedger({
    pool: 'p',
    metrics: dispatcherMetrics(new Registry()),
    prefillRate: new PrefillRate(),
    now: Date.now,
    changed: () => {},
  });
  const lost: string[] = [];
  const failures: unknown[] = [];
  const renewal = new LockRenewal({
    worker: fx.worker,
    ledger,
    lockDurationMs: LOCK_MS,
    lost: (entry) => lost.push(entry.id),
    failed: (err) => failures.push(err),
  });
  return { ledger, renewal, lost, failures };
}

let tokens = 0;
async function begin(ledger: InflightLedger): Promise<InflightJob> {
  const data = payload();
  await fx.queue.add('job', data);
  const token = `t${(tokens += 1)}`;
  const job = (await fx.worker.getNextJob(token, { block: false })) as Job | undefined;
  if (!job) throw new Error('no job taken');
  return ledger.begin(job, token, engine, data, false);
}

const lockKey = (entry: InflightJob) => `${fx.queue.toKey(entry.id)}:lock`;

describe('lock renewal', () => {
  it('extends the locks of the jobs in flight', async () => {
    const { ledger, renewal, lost, failures } = setup();
    const entries = [await begin(ledger), await begin(ledger)];
    // BullMQ's worker took them with its own lock duration (30 s), shorter than LOCK_MS.
    for (const e of entries) expect(await fx.bull.pttl(lockKey(e))).toBeLessThanOrEqual(30_000);
    await renewal.renew();
    for (const e of entries) {
      expect(await fx.bull.get(lockKey(e))).toBe(e.token);
      expect(await fx.bull.pttl(lockKey(e))).toBeGreaterThan(30_000);
    }
    expect([lost, failures]).toEqual([[], []]);
  });

  it('tells a job whose lock is gone lost, once', async () => {
    const { ledger, renewal, lost } = setup();
    const kept = await begin(ledger);
    const gone = await begin(ledger);
    await fx.bull.del(lockKey(gone));
    await renewal.renew();
    await renewal.renew();
    expect(lost).toEqual([gone.id]);
    expect(await fx.bull.get(lockKey(kept))).toBe(kept.token);
  });

  it('does not take a job whose outcome went to BullMQ for lost, though the ledger still holds it', async () => {
    // The state a renewal meets when its extension runs in Redis after the job's completion
    // (same connection, sent first) and its answer is read before the ledger let the job go.
    const { ledger, renewal, lost } = setup();
    const done = await begin(ledger);
    const failedOne = await begin(ledger);
    await recordOutcome(fx.worker, done, 'ok', false);
    await recordOutcome(fx.worker, failedOne, 'engine_error', false);
    expect(await fx.bull.exists(lockKey(done), lockKey(failedOne))).toBe(0);
    expect(ledger.get(done.id)).toBe(done);
    await renewal.renew();
    expect(lost).toEqual([]);
    ledger.complete(done);
    ledger.complete(failedOne);
  });
});
