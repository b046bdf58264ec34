// BullMQ's own take and completion, run as the dispatcher runs them (quietWorkerScripts on
// BullMQ's connection), against a real redis-server: every job is taken, handed over and
// finished as before, locks and the global concurrency included, and nothing is written to
// the events stream, which nobody reads; the take answers how many jobs it left waiting.
import { quietWorkerScripts, waitingAfterTake, type Redis } from '@sluice/redis';
import { Job, type Queue, type Worker } from 'bullmq';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { startQueueFixture, type QueueFixture } from './queue-fixture.ts';

let fixture: QueueFixture;
let redis: Redis;
let queue: Queue;
let worker: Worker;

beforeAll(async () => {
  fixture = await startQueueFixture('quiet-test');
  ({ redis, queue, worker } = fixture);
  await worker.waitUntilReady();
  quietWorkerScripts(fixture.bull);
});
beforeEach(() => redis.flushall());
afterAll(() => fixture.close());

const opts = { attempts: 1, removeOnComplete: true, removeOnFail: true };

async function commandCalls(command: string): Promise<number> {
  const info = await redis.info('commandstats');
  return Number(new RegExp(`^cmdstat_${command}:calls=(\\d+)`, 'm').exec(info)?.[1] ?? 0);
}

/** Completes `job` and takes the next one in the same script, as a slot handover does. */
async function completeAndTakeNext(job: Job, token: string): Promise<Job | undefined> {
  const next = (await job.moveToCompleted('ok', token, true)) as unknown;
  if (!Array.isArray(next) || !next[0]) return undefined;
  const taken = Job.fromJSON(worker, next[0], next[1] as string);
  taken.token = token;
  return taken;
}

describe("BullMQ's take and completion without the events stream", () => {
  it('takes in priority order, hands over, completes and fails as before, with no stream', async () => {
    await queue.setGlobalConcurrency(1);
    await queue.add('completion', {}, { ...opts, jobId: 'low', priority: 5 });
    await queue.add('completion', {}, { ...opts, jobId: 'high', priority: 1 });
    await queue.add('completion', {}, { ...opts, jobId: 'last', priority: 9 });
    // The adds here are BullMQ's own (the gateway's admission quiets its add).
    const xaddsBefore = await commandCalls('xadd');
    const streamBefore = await redis.xlen(queue.keys.events!);

    const first = await worker.getNextJob('t', { block: false });
    expect(first?.id).toBe('high');
    // The lock is BullMQ's, and the global concurrency of 1 keeps a second take empty.
    expect(await redis.get(`${queue.toKey('high')}:lock`)).toBe('t');
    expect(await worker.getNextJob('t2', { block: false })).toBeUndefined();

    const second = await completeAndTakeNext(first!, 't');
    expect(second?.id).toBe('low');
    expect(await queue.getJob('high')).toBeUndefined();
    const third = await completeAndTakeNext(second!, 't');
    expect(third?.id).toBe('last');
    await third!.moveToFailed(new Error('engine_error'), 't', false);

    expect(
      await queue.getJobCounts('active', 'wait', 'prioritized', 'completed', 'failed'),
    ).toEqual({ active: 0, wait: 0, prioritized: 0, completed: 0, failed: 0 });
    expect(await commandCalls('xadd')).toBe(xaddsBefore);
    expect(await redis.xlen(queue.keys.events!)).toBe(streamBefore);
  });

  it('loses no lock check: a completion with a wrong token is refused', async () => {
    await queue.add('completion', {}, { ...opts, jobId: 'a' });
    const job = await worker.getNextJob('right', { block: false });
    expect(job?.id).toBe('a');
    await expect(job!.moveToCompleted('ok', 'wrong', false)).rejects.toThrow(/lock/i);
    expect(await job!.getState()).toBe('active');
    await job!.moveToCompleted('ok', 'right', false);
    expect(await queue.getJob('a')).toBeUndefined();
  });

  it('answers what the take left waiting, and clears the marker with the last job', async () => {
    const marker = () => redis.zrange(queue.keys.marker!, 0, -1);
    await queue.add('completion', {}, { ...opts, jobId: 'a', priority: 1 });
    await queue.add('completion', {}, { ...opts, jobId: 'b' });
    const first = await worker.getNextJob('t', { block: false });
    expect(first?.id).toBe('b');
    expect(waitingAfterTake(fixture.bull, queue.keys.wait!)).toBe(1);
    // BullMQ set its marker again with the take; a job still waits, so it stays.
    expect(await marker()).toEqual(['0']);
    const second = await worker.getNextJob('t', { block: false });
    expect(second?.id).toBe('a');
    expect(waitingAfterTake(fixture.bull, queue.keys.wait!)).toBe(0);
    expect(await marker()).toEqual([]);
    await first!.moveToCompleted('ok', 't', false);
    await second!.moveToCompleted('ok', 't', false);
  });

  // BullMQ's add sets no marker while the queue is at its global concurrency, and its completion
  // and hold set none either: a take blocked on the marker slept through such a job, up to 10 s
  // while a delayed (held) job was due later (marker-rearm.ts).
  it.each([
    ['failed', (job: Job) => job.moveToFailed(new Error('invalid_payload'), 't', false)],
    ['completed', (job: Job) => job.moveToCompleted('ok', 't', false)],
    ['held back', (job: Job) => job.moveToDelayed(Date.now() + 600_000, 't')],
  ])(
    'sets the marker again when a job %s leaves one added while the queue was full',
    async (_, leave) => {
      const marker = () => redis.zrange(queue.keys.marker!, 0, -1);
      await queue.setGlobalConcurrency(1);
      await queue.add('completion', {}, { ...opts, jobId: 'first' });
      const first = await worker.getNextJob('t', { block: false });
      expect(first?.id).toBe('first');
      await queue.add('completion', {}, { ...opts, jobId: 'added-while-full', priority: 3 });
      expect(await marker()).toEqual([]);
      await leave(first!);
      expect(await marker()).toContain('0');
      const next = await worker.getNextJob('t2', { block: false });
      expect(next?.id).toBe('added-while-full');
      await next!.moveToCompleted('ok', 't2', false);
    },
  );
});
