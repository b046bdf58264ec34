// The queue probe against a real redis-server and BullMQ: it counts what a take could get,
// clears BullMQ's wake-up marker only when nothing waits, and a worker marked drained blocks
// on the marker before its next take instead of trying an empty one.
import type { Redis } from '@sluice/redis';
import type { Queue, Worker } from 'bullmq';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { eventually } from '@sluice/test/support';
import { startQueueFixture, type QueueFixture } from './queue-fixture.ts';
import { markDrained, queueProbe } from '../src/queue-probe.ts';

let fixture: QueueFixture;
let redis: Redis;
let queue: Queue;
let worker: Worker;
let probe: () => Promise<number>;

beforeAll(async () => {
  fixture = await startQueueFixture('probe-test');
  ({ redis, queue, worker } = fixture);
  probe = queueProbe(fixture.bull, worker);
});
beforeEach(() => redis.flushall());
afterAll(() => fixture.close());

const marker = () => redis.zrange(queue.keys.marker!, 0, -1, 'WITHSCORES');

/** Calls of `command` so far, from INFO commandstats (the commands BullMQ's Lua runs included). */
async function calls(command: string): Promise<number> {
  const info = await redis.info('commandstats');
  return Number(new RegExp(`^cmdstat_${command}:calls=(\\d+)`, 'm').exec(info)?.[1] ?? 0);
}

describe('queue probe', () => {
  it('counts prioritised and plain waiting jobs, and leaves the marker while any waits', async () => {
    await queue.add('completion', {}, { jobId: 'a', priority: 2 });
    await queue.add('completion', {}, { jobId: 'b' });
    expect(await probe()).toBe(2);
    expect(await marker()).toEqual(['0', '0']);
  });

  it('clears the marker the last take set again once nothing waits', async () => {
    await queue.add('completion', {}, { jobId: 'a', priority: 1 });
    const job = await worker.getNextJob('t1', { block: false });
    expect(job?.id).toBe('a');
    // The take that got the last job set the marker again (prepareJobForProcessing.lua).
    expect(await marker()).toEqual(['0', '0']);
    expect(await probe()).toBe(0);
    expect(await marker()).toEqual([]);
  });

  it("keeps a held job's marker: it wakes the take at that job's time", async () => {
    await queue.add('completion', {}, { jobId: 'h', delay: 60_000 });
    expect(await probe()).toBe(0);
    const left = await marker();
    expect(left[0]).toBe('1');
    expect(Number(left[1])).toBeGreaterThan(0);
  });

  it('makes the next blocking take wait on the marker instead of trying an empty take first', async () => {
    await queue.add('completion', {}, { jobId: 'a', priority: 1 });
    expect((await worker.getNextJob('t1', { block: true }))?.id).toBe('a');
    expect(await probe()).toBe(0);
    markDrained(worker);
    const takesBefore = await calls('rpoplpush');
    const next = worker.getNextJob('t2', { block: true });
    await eventually(
      async () => / cmd=bzpopmin /.test(String(await redis.client('LIST'))),
      'the take blocked on the marker',
    );
    // Blocked on the marker, and no take ran meanwhile.
    expect(await calls('rpoplpush')).toBe(takesBefore);
    await queue.add('completion', {}, { jobId: 'b', priority: 1 });
    expect((await next)?.id).toBe('b');
    expect(await calls('rpoplpush')).toBe(takesBefore + 1);
  });
});
