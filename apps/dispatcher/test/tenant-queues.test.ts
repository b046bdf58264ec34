// The tenants' queued sets against a real redis-server and BullMQ: which job each tenant has
// waiting next, and moving the fair share's pick to the front of the queue.
import { keySpace } from '@sluice/protocol';
import type { Redis } from '@sluice/redis';
import type { Queue, Worker } from 'bullmq';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { startQueueFixture, type QueueFixture } from './queue-fixture.ts';
import { TenantQueues } from '../src/tenant-queues.ts';

let fixture: QueueFixture;
let redis: Redis;
let queue: Queue;
let worker: Worker;
let queues: TenantQueues;
const keys = keySpace('tq-test');

beforeAll(async () => {
  fixture = await startQueueFixture('tq-test');
  ({ redis, queue, worker } = fixture);
  queues = new TenantQueues('p', ['alpha', 'beta', 'gamma'], keys, redis, queue);
});
beforeEach(() => redis.flushall());
afterAll(() => fixture.close());

/** Queues a job as a gateway does: BullMQ priority 1 (the default class), and its tenant's member. */
async function add(tenant: string, id: string, priority = 1): Promise<void> {
  await queue.add('completion', { tenant }, { jobId: id, priority });
  await redis.zadd(keys.tenantQueued('p', tenant), priority, id);
}

describe('tenant queues', () => {
  it("names each tenant's next waiting job in its own order, and the queue's own next", async () => {
    await add('alpha', 'a1');
    await add('alpha', 'a2');
    await add('beta', 'b1', 3);
    await add('beta', 'b2', 2);
    const reading = await queues.read();
    expect(reading.next).toBe('a1');
    expect(reading.tenants).toEqual([
      { tenant: 'alpha', queued: 2, head: 'a1' },
      { tenant: 'beta', queued: 2, head: 'b2' },
      { tenant: 'gamma', queued: 0, head: undefined },
    ]);
  });

  it('moves the pick to the front: the next take is it, and the order behind it stays', async () => {
    await add('alpha', 'a1');
    await add('alpha', 'a2');
    await add('beta', 'b1');
    await queues.moveToFront('b1');
    expect((await queues.read()).next).toBe('b1');
    const taken = [];
    for (let i = 0; i < 3; i += 1)
      taken.push((await worker.getNextJob(`t${i}`, { block: false }))?.id);
    expect(taken).toEqual(['b1', 'a1', 'a2']);
  });

  it('skips running and held jobs, counts them, and drops members whose job is gone', async () => {
    await add('alpha', 'a1');
    await add('alpha', 'a2');
    await add('alpha', 'a3');
    await add('beta', 'b1');
    const running = await worker.getNextJob('tok', { block: false });
    expect(running?.id).toBe('a1');
    const held = await worker.getNextJob('tok2', { block: false });
    expect(held?.id).toBe('a2');
    await held!.moveToDelayed(Date.now() + 60_000, 'tok2');
    await queue.remove('b1');
    const reading = await queues.read();
    expect(reading.tenants.slice(0, 2)).toEqual([
      { tenant: 'alpha', queued: 3, head: 'a3' },
      { tenant: 'beta', queued: 0, head: undefined },
    ]);
    expect(await redis.zrange(keys.tenantQueued('p', 'beta'), 0, -1)).toEqual([]);
    queues.remove('alpha', 'a1');
    expect(await redis.zrange(keys.tenantQueued('p', 'alpha'), 0, -1)).toEqual(['a2', 'a3']);
  });
});
