// The parked watch's existence reads, against a real redis-server, on a clock of the test's
// own: a job missing at one read is reported lost only when the next read, about an interval
// later, still misses it and it is still parked; reads back to back count as one.
import { createRedis, redisReady, type Redis } from '@sluice/redis';
import { startRedis, type TestRedis } from '@sluice/test/support';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import type { HeldRequest } from '../src/held-request.ts';
import { ParkedWatch, SECOND_READ_AFTER } from '../src/parked-watch.ts';

const INTERVAL_MS = 1000;
let server: TestRedis;
let redis: Redis;
let clock = 0;

beforeAll(async () => {
  server = await startRedis();
  redis = createRedis(server.url, { name: 'cmd', role: 'command' });
  await redisReady(redis);
});
beforeEach(async () => {
  await redis.flushall();
  clock = 1_000_000;
});
afterAll(async () => {
  await redis.quit();
  await server.stop();
});

/** A parked client whose job lives at `jobKey`; only what the watch reads of it. */
function parked(jobKey: string): HeldRequest {
  return { jobId: jobKey, jobKey, parked: true } as unknown as HeldRequest;
}

function watch(held: HeldRequest[]) {
  const lost: string[] = [];
  const errors: unknown[] = [];
  const w = new ParkedWatch(redis, () => held, {
    intervalMs: INTERVAL_MS,
    listening: () => true,
    onLost: (h) => lost.push(h.jobId),
    onError: (err) => errors.push(err),
    now: () => clock,
  });
  return { w, lost, errors };
}

describe('parked watch: jobs missing from Redis', () => {
  it('reports a job missing at two reads about an interval apart, not one still there', async () => {
    await redis.set('there', '1');
    const { w, lost, errors } = watch([parked('gone'), parked('there')]);
    await w.check();
    expect(lost).toEqual([]);
    // The next round, its answers read a little sooner than a whole interval after the first.
    clock += INTERVAL_MS - 30;
    await w.check();
    expect(lost).toEqual(['gone']);
    expect(errors).toEqual([]);
  });

  it('takes reads back to back for one: the frames of a job just served still have time', async () => {
    const { w, lost } = watch([parked('gone')]);
    await w.check();
    clock += Math.floor(INTERVAL_MS * SECOND_READ_AFTER) - 1;
    await w.check();
    expect(lost).toEqual([]);
    // Still measured from the first read that missed it.
    clock += 1;
    await w.check();
    expect(lost).toEqual(['gone']);
  });

  it('starts over for a job found again, and never reports one no longer parked', async () => {
    const back = parked('back');
    const started = parked('started');
    const { w, lost } = watch([back, started]);
    await w.check();
    await redis.set('back', '1');
    (started as { parked: boolean }).parked = false;
    clock += INTERVAL_MS;
    await w.check();
    await redis.del('back');
    clock += INTERVAL_MS;
    await w.check();
    expect(lost).toEqual([]);
    clock += INTERVAL_MS;
    await w.check();
    expect(lost).toEqual(['back']);
  });
});
