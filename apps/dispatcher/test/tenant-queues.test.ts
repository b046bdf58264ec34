// The tenants' queued sets against a real redis-server and BullMQ: which jobs each tenant has
// waiting next, moving the fair share's pick to the front of the queue, and the reading sent
// with the move, ahead of the take.
import { keySpace } from '@sluice/protocol';
import type { Redis } from '@sluice/redis';
import type { Queue, Worker } from 'bullmq';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { startQueueFixture, type QueueFixture } from './queue-fixture.ts';
import { afterTake, TenantQueues, type TenantQueuesReading } from '../src/tenant-queues.ts';

let fixture: QueueFixture;
let redis: Redis;
let bull: Redis;
let queue: Queue;
let worker: Worker;
let queues: TenantQueues;
const keys = keySpace('tq-test');

beforeAll(async () => {
  fixture = await startQueueFixture('tq-test');
  ({ redis, bull, queue, worker } = fixture);
  queues = new TenantQueues('p', ['alpha', 'beta', 'gamma'], keys, redis, bull, queue);
});
beforeEach(() => redis.flushall());
afterAll(() => fixture.close());

/** Queues a job as a gateway does: BullMQ priority 1 (the default class), and its tenant's member. */
async function add(tenant: string, id: string, priority = 1): Promise<void> {
  await queue.add('completion', { tenant }, { jobId: id, priority });
  await redis.zadd(keys.tenantQueued('p', tenant), priority, id);
}

describe('tenant queues', () => {
  it("names each tenant's next two waiting jobs in its own order, and the queue's own next two", async () => {
    await add('alpha', 'a1');
    await add('alpha', 'a2');
    await add('alpha', 'a3');
    await add('beta', 'b1', 3);
    await add('beta', 'b2', 2);
    const reading = await queues.read();
    expect(reading.next).toBe('a1');
    expect(reading.afterNext).toBe('a2');
    expect(reading.tenants).toEqual([
      { tenant: 'alpha', queued: 3, head: 'a1', afterHead: 'a2' },
      { tenant: 'beta', queued: 2, head: 'b2', afterHead: 'b1' },
      { tenant: 'gamma', queued: 0, head: undefined, afterHead: undefined },
    ]);
  });

  it('moves the pick to the front in the same script as the reading, which sees it first', async () => {
    await add('alpha', 'a1');
    await add('alpha', 'a2');
    await add('beta', 'b1');
    await queues.ready();
    const { moved, reading } = await queues.moveAndRead('b1');
    expect(moved).toBe(true);
    expect([reading.next, reading.afterNext]).toEqual(['b1', 'a1']);
    expect(reading.tenants[1]).toEqual({
      tenant: 'beta',
      queued: 1,
      head: 'b1',
      afterHead: undefined,
    });
    const taken = [];
    for (let i = 0; i < 3; i += 1)
      taken.push((await worker.getNextJob(`t${i}`, { block: false }))?.id);
    expect(taken).toEqual(['b1', 'a1', 'a2']);
  });

  it('runs before a take called right after it, without waiting for its answer', async () => {
    await add('alpha', 'a1');
    await add('beta', 'b1');
    await queues.ready();
    // Both on BullMQ's connection, the move first: the take gets the moved job.
    const ahead = queues.moveAndRead('b1');
    const job = await worker.getNextJob('t', { block: false });
    expect(job?.id).toBe('b1');
    const { reading } = await ahead;
    // The reading was made before the take: the job the take got is its next.
    expect(reading.next).toBe('b1');
    expect(afterTake(reading, 'b1')).toEqual({
      next: 'a1',
      afterNext: undefined,
      tenants: [
        { tenant: 'alpha', queued: 1, head: 'a1', afterHead: undefined },
        { tenant: 'beta', queued: 0, head: undefined, afterHead: undefined },
        { tenant: 'gamma', queued: 0, head: undefined, afterHead: undefined },
      ],
    });
  });

  it('answers a move of a job that is gone as not moved, and still reads', async () => {
    await add('alpha', 'a1');
    await queues.ready();
    const { moved, reading } = await queues.moveAndRead('nobody');
    expect(moved).toBe(false);
    expect(reading.next).toBe('a1');
    expect((await queues.moveAndRead(undefined)).moved).toBeUndefined();
  });

  it('skips running and held jobs, counts them, and drops members whose job is gone', async () => {
    await add('alpha', 'a1');
    await add('alpha', 'a2');
    await add('alpha', 'a3');
    await add('alpha', 'a4');
    await add('beta', 'b1');
    const running = await worker.getNextJob('tok', { block: false });
    expect(running?.id).toBe('a1');
    const held = await worker.getNextJob('tok2', { block: false });
    expect(held?.id).toBe('a2');
    await held!.moveToDelayed(Date.now() + 60_000, 'tok2');
    await queue.remove('b1');
    const reading = await queues.read();
    expect(reading.tenants.slice(0, 2)).toEqual([
      { tenant: 'alpha', queued: 4, head: 'a3', afterHead: 'a4' },
      { tenant: 'beta', queued: 0, head: undefined, afterHead: undefined },
    ]);
    expect(await redis.zrange(keys.tenantQueued('p', 'beta'), 0, -1)).toEqual([]);
    queues.remove('alpha', 'a1');
    expect(await redis.zrange(keys.tenantQueued('p', 'alpha'), 0, -1)).toEqual(['a2', 'a3', 'a4']);
  });
});

describe('afterTake', () => {
  const reading: TenantQueuesReading = {
    next: 'b1',
    afterNext: 'a1',
    tenants: [
      { tenant: 'alpha', queued: 3, head: 'a1', afterHead: 'a2' },
      { tenant: 'beta', queued: 2, head: 'b1', afterHead: 'b2' },
    ],
  };

  it("takes the job off the front and off its tenant's head; what lies beyond one take is unknown", () => {
    expect(afterTake(reading, 'b1')).toEqual({
      next: 'a1',
      afterNext: undefined,
      tenants: [
        { tenant: 'alpha', queued: 3, head: 'a1', afterHead: 'a2' },
        { tenant: 'beta', queued: 1, head: 'b2', afterHead: undefined },
      ],
    });
  });

  it('knows nothing when the take got another job than the next one', () => {
    expect(afterTake(reading, 'a1')).toBeUndefined();
    expect(afterTake({ ...reading, next: undefined }, 'b1')).toBeUndefined();
  });
});
