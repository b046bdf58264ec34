// The take watchdog's decision (pure, time passed in), its episodes, and the BullMQ behaviour
// its recovery relies on, on a real redis-server: interrupting a worker's blocked take, and a
// take after an abandoned one blocking on the marker again.
import { Job } from 'bullmq';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { PoolWorker } from '../src/job-build.ts';
import { forgetWait, markDrained } from '../src/queue-probe.ts';
import {
  LONGEST_TAKE_MS,
  resetBlocking,
  takeStallMs,
  takeStalled,
  TakeWatchdog,
  type TakeWatchView,
} from '../src/take-watchdog.ts';
import { startQueueFixture, type QueueFixture } from './queue-fixture.ts';

const STALL = takeStallMs(5000);

const view = (over: Partial<TakeWatchView> = {}): TakeWatchView => ({
  now: 100_000 + STALL,
  unansweredSince: 100_000,
  waiting: 3,
  admits: true,
  mayTake: true,
  stallMs: STALL,
  ...over,
});

describe('takeStalled', () => {
  it('holds once a take has gone the whole bound unanswered, with jobs waiting and the gate open', () => {
    expect(takeStalled(view())).toBe(true);
    expect(takeStalled(view({ now: 100_000 + STALL * 10 }))).toBe(true);
  });

  it('not before the bound', () => {
    expect(takeStalled(view({ now: 100_000 + STALL - 1 }))).toBe(false);
  });

  it('not without waiting jobs: an idle queue has nothing to take (held jobs are not counted)', () => {
    expect(takeStalled(view({ waiting: 0 }))).toBe(false);
  });

  it('not with the gate closed: the loop does not take then', () => {
    expect(takeStalled(view({ admits: false }))).toBe(false);
  });

  it('not when the loop may not take (standby, closing, paused, Redis away)', () => {
    expect(takeStalled(view({ mayTake: false }))).toBe(false);
  });

  it('not while the loop is not taking at all', () => {
    expect(takeStalled(view({ unansweredSince: undefined }))).toBe(false);
  });
});

describe('takeStallMs', () => {
  it("is BullMQ's longest healthy take plus one lease TTL", () => {
    expect(takeStallMs(5000)).toBe(16_000);
    expect(takeStallMs(1000)).toBe(LONGEST_TAKE_MS + 1000);
    expect(takeStallMs(500)).toBeGreaterThan(LONGEST_TAKE_MS);
  });
});

describe('TakeWatchdog', () => {
  it('recovers at the first stalled check (the episode starts), again only a whole bound after, until a take answers', () => {
    const dog = new TakeWatchdog();
    const start = view();
    expect(dog.due(start)).toBe(true);
    expect(dog.check(start)).toEqual({ recover: true, first: true });
    expect(dog.inEpisode).toBe(true);
    // The recovery counts as the loop's last sign of life.
    const soon = view({ now: start.now + STALL - 1 });
    expect(dog.due(soon)).toBe(false);
    expect(dog.check(soon)).toEqual({ recover: false });
    const later = view({ now: start.now + STALL });
    expect(dog.due(later)).toBe(true);
    expect(dog.check(later)).toEqual({ recover: true, first: false });
    // A take answered: the episode is over, and a new stall is a new one.
    dog.answered();
    expect(dog.inEpisode).toBe(false);
    const next = view({ now: later.now + 2 * STALL, unansweredSince: later.now + STALL });
    expect(dog.check(next)).toEqual({ recover: true, first: true });
  });

  it('does nothing while the loop answers, whatever the queue holds', () => {
    const dog = new TakeWatchdog();
    for (let t = 0; t < 10; t += 1) {
      const v = view({ now: 100_000 + t * STALL, unansweredSince: 100_000 + t * STALL - 1 });
      expect(dog.check(v)).toEqual({ recover: false });
    }
    expect(dog.inEpisode).toBe(false);
  });

  it('is not due with the gate closed, so the queue is not read', () => {
    expect(new TakeWatchdog().due(view({ admits: false }))).toBe(false);
  });
});

describe('the BullMQ side of a recovery', () => {
  let fx: QueueFixture;
  let worker: PoolWorker;
  beforeAll(async () => {
    fx = await startQueueFixture('take-watchdog-test');
    // A blocked take waits on the marker for up to a minute: only the reset ends it sooner.
    worker = new PoolWorker(fx.keys.queueName('p'), null, {
      connection: fx.bull,
      prefix: fx.keys.prefix,
      autorun: false,
      drainDelay: 60,
    });
    await worker.waitUntilReady();
  });
  afterAll(async () => {
    await worker?.close(true);
    await fx?.close();
  });

  /** Resolves once the worker's blocking connection is in BZPOPMIN (CLIENT LIST says so). */
  async function blocked(): Promise<void> {
    for (;;) {
      const list = String(await fx.redis.call('CLIENT', 'LIST'));
      if (/ flags=b .*cmd=bzpopmin/.test(list)) return;
      await new Promise((resolve) => setImmediate(resolve));
    }
  }

  it("ends a take blocked on the marker, and the worker's next take gets a job", async () => {
    markDrained(worker);
    const take = worker.getNextJob('t1', { block: true });
    await blocked();
    await resetBlocking(worker);
    expect(await take).toBeUndefined();
    await fx.queue.add('j', { n: 1 });
    const job = await worker.getNextJob('t2', { block: true });
    expect(job).toBeInstanceOf(Job);
    expect(job!.data).toEqual({ n: 1 });
    await job!.moveToCompleted('ok', 't2', false);
  }, 30_000);

  /** Calls of `command` so far (INFO commandstats; BullMQ's Lua counts its own). */
  async function calls(command: string): Promise<number> {
    const info = await fx.redis.info('commandstats');
    return Number(new RegExp(`^cmdstat_${command}:calls=(\\d+)`, 'm').exec(info)?.[1] ?? 0);
  }

  it('a take after an abandoned one blocks on the marker (forgetWait); the late job of the abandoned one goes back', async () => {
    // No marker left by the takes before: the take blocks.
    await fx.redis.del(fx.queue.keys.marker!);
    markDrained(worker);
    // The take the loop abandons: blocked on the marker, as a hung one would be.
    const abandoned = worker.getNextJob('old', { block: true });
    await blocked();
    forgetWait(worker);
    const takesBefore = await calls('rpoplpush');
    // Without forgetWait BullMQ would run moveToActive at once (an empty take, and the loop
    // would spin); with it, the take sends its own BZPOPMIN, queued behind the blocked one.
    const next = worker.getNextJob('new', { block: true });
    for (;;) {
      const list = String(await fx.redis.call('CLIENT', 'LIST'));
      if (/ flags=b .* qbuf=[1-9]\d* .*cmd=bzpopmin/.test(list)) break;
      await new Promise((resolve) => setImmediate(resolve));
    }
    expect(await calls('rpoplpush')).toBe(takesBefore);
    await fx.queue.add('j', { n: 2 }, { jobId: 'late' });
    // The abandoned take wakes first and gets the job: it goes back untouched (release-loop.ts).
    const late = await abandoned;
    expect(late?.id).toBe('late');
    await late!.moveToWait('old');
    // The next take gets it, or found the queue empty before it went back: either way the job
    // is not lost.
    const taken = await next;
    if (taken) {
      expect(taken.id).toBe('late');
      await taken.moveToCompleted('ok', 'new', false);
    } else expect(await fx.queue.getJobState('late')).toBe('waiting');
  }, 30_000);
});
