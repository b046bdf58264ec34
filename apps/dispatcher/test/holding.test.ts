// Holding jobs back and promoting them, on a real BullMQ queue: a promoted job goes to the
// queue's front, ahead of the jobs of its class queued while it was held, so the next take
// (the loop's, or a slot handover) is its own. A new leader adopts the held jobs it finds,
// discarding one that can never run without losing the others.
import { dispatcherMetrics, Registry } from '@sluice/observability';
import { bullPriority, type JobPayload } from '@sluice/protocol';
import type { Job } from 'bullmq';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createEngineSlot } from '../src/engine-slot.ts';
import { Holding } from '../src/holding.ts';
import { startQueueFixture, type QueueFixture } from './queue-fixture.ts';

const longPrompts = {
  thresholdTokens: 8192,
  maxShare: 0.5,
  maxInPrefill: 1,
  agingSeconds: 60,
  kvFit: true,
};
const silent = { info: () => {}, warn: () => {} };

let fx: QueueFixture;
beforeAll(async () => {
  fx = await startQueueFixture('holding-test');
});
afterAll(async () => {
  await fx?.close();
});

const payload = (promptTokens: number): JobPayload => ({
  v: 1,
  body: '{}',
  path: '/v1/completions',
  stream: false,
  replica: 'gw',
  enqueuedAt: Date.now(),
  deadline: Date.now() + 60_000,
  priority: 0,
  promptTokens,
});

function engineOfCap(cap: number) {
  return createEngineSlot(
    { name: 'e', url: 'http://127.0.0.1:1', maxInflight: cap, capSource: 'config', lane: 'any' },
    {
      timeouts: { headersTimeoutMs: 1000, bodyTimeoutMs: 1000 },
      scrape: { intervalMs: 1000, staleAfterFailures: 3 },
      now: Date.now,
    },
  );
}

describe('Holding', () => {
  it('adopts the held jobs it finds, discarding one whose data is not JSON or whose payload is invalid', async () => {
    const metrics = dispatcherMetrics(new Registry());
    const engine = engineOfCap(0);
    const holding = new Holding({
      pool: 'p',
      queue: fx.queue,
      redis: fx.redis,
      metrics,
      log: silent,
      longPrompts,
      isLeader: () => true,
      context: (now) => ({
        engines: [engine],
        policy: longPrompts,
        gate: { kvThreshold: 0.9, failMode: 'open', maxGaugeAgeMs: 5000 },
        now,
      }),
      changed: () => {},
      now: Date.now,
    });
    // What a predecessor held back (moveToDelayed): delayed past the test.
    const delay = 60_000;
    await fx.queue.add('c', payload(10), { jobId: 'adopt-a', delay });
    await fx.queue.add('c', {}, { jobId: 'adopt-cut', delay });
    await fx.redis.hset(fx.queue.toKey('adopt-cut'), 'data', '{"v":1,"trunc');
    await fx.queue.add('c', { ...payload(10), replica: 'gw 1' }, { jobId: 'adopt-bad', delay });
    await fx.queue.add('c', payload(20), { jobId: 'adopt-b', delay });
    await holding.adopt();
    expect(
      holding.held
        .ordered()
        .map((h) => h.id)
        .sort(),
    ).toEqual(['adopt-a', 'adopt-b']);
    expect(await fx.queue.getJobState('adopt-a')).toBe('delayed');
    // Discarded: gone, counted as the release loop counts a job it fails for its payload.
    expect(await fx.redis.exists(fx.queue.toKey('adopt-cut'), fx.queue.toKey('adopt-bad'))).toBe(0);
    expect((await metrics.skipped.get()).values).toEqual([
      { labels: { pool: 'p', reason: 'invalid_payload' }, value: 2 },
    ]);
    await fx.queue.remove('adopt-a');
    await fx.queue.remove('adopt-b');
  });

  it('promotes a held job to the front of the queue, ahead of its class queued meanwhile', async () => {
    // The engine's slot count decides whether the held job may go: none at first.
    const engine = engineOfCap(0);
    // The promotion ends with `changed` (the loop looks again): the event this test waits on.
    let promotionDone!: () => void;
    const promotion = new Promise<void>((resolve) => (promotionDone = resolve));
    const holding = new Holding({
      pool: 'p',
      queue: fx.queue,
      redis: fx.redis,
      metrics: dispatcherMetrics(new Registry()),
      log: silent,
      longPrompts,
      isLeader: () => true,
      context: (now) => ({
        engines: [engine],
        policy: longPrompts,
        gate: { kvThreshold: 0.9, failMode: 'open', maxGaugeAgeMs: 5000 },
        now,
      }),
      changed: () => promotionDone(),
      now: Date.now,
    });
    const short = bullPriority(0, 10, 'short');
    await fx.queue.add('c', payload(10), { jobId: 'held', priority: short });
    const job = (await fx.worker.getNextJob('t1', { block: false })) as Job;
    expect(job.id).toBe('held');
    const p = payload(10);
    await holding.hold(
      job,
      't1',
      p,
      { id: 'held', job, promptTokens: 10, long: false, priority: 0, enqueuedAt: p.enqueuedAt },
      'gate',
    );
    expect(await fx.queue.getJobState('held')).toBe('delayed');
    expect(holding.held.promoted).toBeUndefined();
    // Jobs of the same class (and of a more urgent one) arrive while it is held.
    for (let i = 0; i < 3; i += 1)
      await fx.queue.add('c', payload(10), { jobId: `later${i}`, priority: short });
    await fx.queue.add('c', payload(10), { jobId: 'urgent', priority: 1 });

    engine.cap = 4;
    holding.maybePromote();
    expect(holding.held.promoted).toBe('held');
    await promotion;
    const next = await fx.worker.getNextJob('t2', { block: false });
    expect(next?.id).toBe('held');
    holding.taken('held');
    expect(holding.held.promoted).toBeUndefined();
    // The rest keep BullMQ's own order.
    expect((await fx.worker.getNextJob('t3', { block: false }))?.id).toBe('urgent');
    expect((await fx.worker.getNextJob('t4', { block: false }))?.id).toBe('later0');
  });
});
