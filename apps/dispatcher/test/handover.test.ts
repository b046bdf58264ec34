// The slot handover: when a run may hand its slot to the next job (worked examples of the
// rule), and what BullMQ's moveToFinished with fetchNext does on a real redis-server: the
// next job active under the same lock, nothing past the queue's global concurrency.
import type { GatePolicy } from '@sluice/admission';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Job } from 'bullmq';
import type { EngineSlot } from '../src/engine-slot.ts';
import { mayHandOver, recordOutcome, type HandoverView } from '../src/handover.ts';
import type { InflightJob } from '../src/ledger.ts';
import { startQueueFixture, type QueueFixture } from './queue-fixture.ts';

const NOW = 1_000_000;
const policy: GatePolicy = { kvThreshold: 0.9, failMode: 'closed', maxGaugeAgeMs: 5000 };

function engine(name: string, inflight: number, cap: number, busy = 0, kvUsage = 0.1) {
  return {
    name,
    inflight,
    cap,
    health: 'healthy',
    gauges: { running: inflight + busy, waiting: 0, kvUsage, at: NOW, inflightAtScrape: inflight },
  } as unknown as EngineSlot;
}

const ending = (e: EngineSlot) => ({ engine: e, payload: {} }) as InflightJob;

function view(engines: EngineSlot[], over: Partial<HandoverView> = {}): HandoverView {
  return {
    engines,
    policy,
    now: NOW,
    loopWaiting: false,
    promotedPending: false,
    mayTake: true,
    ...over,
  };
}

describe('mayHandOver', () => {
  it('hands a full engine’s slot over: freed, the gate admits again', () => {
    const a = engine('a', 4, 4);
    expect(mayHandOver(ending(a), view([a]))).toBe(true);
  });

  it('keeps the slot when the gate stays closed with it free (bypass traffic, KV pressure)', () => {
    const busy = engine('a', 4, 4, 1);
    expect(mayHandOver(ending(busy), view([busy]))).toBe(false);
    const kv = engine('a', 4, 4, 0, 0.95);
    expect(mayHandOver(ending(kv), view([kv]))).toBe(false);
  });

  it('hands over to another engine of the pool that has room', () => {
    const a = engine('a', 4, 4, 0, 0.95);
    const b = engine('b', 1, 4);
    expect(mayHandOver(ending(a), view([a, b]))).toBe(true);
  });

  it('leaves the next job to the loop or the promoted job when they choose', () => {
    const a = engine('a', 4, 4);
    for (const over of [{ loopWaiting: true }, { promotedPending: true }, { mayTake: false }])
      expect(mayHandOver(ending(a), view([a], over)), JSON.stringify(over)).toBe(false);
  });

  it('reads the counts without changing them', () => {
    const a = engine('a', 4, 4);
    mayHandOver(ending(a), view([a]));
    expect(a.inflight).toBe(4);
  });
});

describe('recordOutcome', () => {
  let fx: QueueFixture;
  beforeAll(async () => {
    fx = await startQueueFixture('handover-test');
  });
  afterAll(async () => {
    await fx?.close();
  });

  let n = 0;
  async function take(): Promise<InflightJob> {
    const token = `t${(n += 1)}`;
    const job = (await fx.worker.getNextJob(token, { block: false })) as Job;
    expect(job).toBeTruthy();
    return { id: job.id!, job, token } as InflightJob;
  }

  it('completes the job and takes the next under the same lock token', async () => {
    await fx.queue.add('a', { n: 1 });
    await fx.queue.add('b', { n: 2 });
    const first = await take();
    const next = await recordOutcome(fx.worker, first, 'ok', true);
    expect(await fx.queue.getJobState(first.id)).toBe('completed');
    expect(next?.data).toEqual({ n: 2 });
    expect(await fx.queue.getJobState(next!.id!)).toBe('active');
    // The lock is ours: completing it with the token works, with another it would not.
    await expect(next!.moveToCompleted('ok', 'someone-else', false)).rejects.toThrow();
    const none = await recordOutcome(
      fx.worker,
      { ...first, job: next!, id: next!.id! },
      'ok',
      true,
    );
    expect(none).toBeUndefined();
    expect(await fx.queue.getJobState(next!.id!)).toBe('completed');
  });

  it('fails the job for any other outcome, and takes nothing without fetchNext', async () => {
    await fx.queue.add('a', { n: 3 });
    await fx.queue.add('b', { n: 4 });
    const first = await take();
    expect(await recordOutcome(fx.worker, first, 'engine_error', false)).toBeUndefined();
    expect(await fx.queue.getJobState(first.id)).toBe('failed');
    expect(await fx.queue.getWaitingCount()).toBe(1);
    const second = await take();
    await recordOutcome(fx.worker, second, 'ok', false);
  });

  it('takes nothing past the global concurrency: the slot was not the only one counted', async () => {
    await fx.queue.setGlobalConcurrency(1);
    try {
      await fx.queue.add('a', { n: 5 });
      await fx.queue.add('b', { n: 6 });
      await fx.queue.add('c', { n: 7 });
      const first = await take();
      // A second job active beside it (another process that thinks it leads): BullMQ sees 2
      // active with a concurrency of 1, so completing the first may not take a third.
      await fx.queue.setGlobalConcurrency(2);
      const second = await take();
      await fx.queue.setGlobalConcurrency(1);
      expect(await recordOutcome(fx.worker, first, 'ok', true)).toBeUndefined();
      const next = await recordOutcome(fx.worker, second, 'ok', true);
      expect(next?.data).toEqual({ n: 7 });
      await recordOutcome(fx.worker, { ...second, job: next!, id: next!.id! }, 'ok', false);
    } finally {
      await fx.queue.removeGlobalConcurrency();
    }
  });

  it('has nothing to hand over when the job is no longer ours', async () => {
    await fx.queue.add('a', { n: 8 });
    await fx.queue.add('b', { n: 9 });
    const first = await take();
    await first.job.remove().catch(() => {});
    await fx.redis.del(`${fx.keys.prefix}:${fx.keys.queueName('p')}:${first.id}:lock`);
    expect(await recordOutcome(fx.worker, first, 'ok', true)).toBeUndefined();
    expect(await fx.queue.getWaitingCount()).toBe(1);
  });
});
