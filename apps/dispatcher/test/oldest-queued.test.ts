// The oldest queued job's add time, read from BullMQ's own structures on a real redis-server:
// wait list ends, the head of each priority band, the first held job.
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { oldestQueuedAt } from '../src/oldest-queued.ts';
import { PoolControl } from '../src/pool-control.ts';
import { startQueueFixture, type QueueFixture } from './queue-fixture.ts';

let fx: QueueFixture;
beforeAll(async () => {
  fx = await startQueueFixture('oldest-test');
});
beforeEach(() => fx.redis.flushall());
afterAll(async () => {
  await fx?.close();
});

const oldest = () => oldestQueuedAt(fx.redis, fx.keys, 'p');
const add = (id: string, timestamp: number, opts: Record<string, unknown> = {}) =>
  fx.queue.add('completion', {}, { jobId: id, timestamp, ...opts });

describe('oldestQueuedAt', () => {
  it('is undefined for an empty queue', async () => {
    expect(await oldest()).toBeUndefined();
  });

  it('finds the oldest job behind younger bands, whatever the band order', async () => {
    // Band 2 is served first, but band 7's first job is older; band 7's second is younger.
    await add('b7-old', 1000, { priority: 7 });
    await add('b2', 3000, { priority: 2 });
    await add('b7-young', 2000, { priority: 7 });
    for (let i = 0; i < 20; i += 1) await add(`b4-${i}`, 5000 + i, { priority: 4 });
    expect(await oldest()).toBe(1000);
  });

  it('counts a job at the front of the wait list and a held (delayed) job', async () => {
    await add('prio', 3000, { priority: 3 });
    await add('front', 2000, { lifo: true });
    expect(await oldest()).toBe(2000);
    await add('held', 500, { delay: 60_000 });
    expect(await oldest()).toBe(500);
  });

  it('no longer counts a job once it is taken', async () => {
    await add('a', 1000, { priority: 1 });
    await add('b', 2000, { priority: 1 });
    const job = await fx.worker.getNextJob('t');
    expect(job?.id).toBe('a');
    expect(await oldest()).toBe(2000);
  });
});

describe('PoolControl', () => {
  it('applies what the control key says, absent as open, and reports each change once', async () => {
    const changes: string[] = [];
    const warnings: string[] = [];
    const control = new PoolControl({
      pool: 'p',
      key: fx.keys.poolControl('p'),
      redis: fx.redis,
      changed: (mode, before) => changes.push(`${before}->${mode}`),
      warn: (msg) => warnings.push(msg),
    });
    await control.refresh();
    expect(control.mode).toBe('open');
    await fx.redis.set(fx.keys.poolControl('p'), 'paused');
    await control.refresh();
    await control.refresh();
    expect(control.mode).toBe('paused');
    await fx.redis.set(fx.keys.poolControl('p'), 'draining');
    await control.refresh();
    await fx.redis.set(fx.keys.poolControl('p'), 'bogus');
    await control.refresh();
    expect(control.mode).toBe('open');
    expect(changes).toEqual(['open->paused', 'paused->draining', 'draining->open']);
    expect(warnings).toEqual(['unreadable pool mode: treated as open']);
  });
});
