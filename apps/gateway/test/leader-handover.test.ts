// The gateway's leader check against a real redis-server, on a clock of the test's own: a
// lease that goes missing while it changes hands is not refused (the next leader takes what
// is queued), one that stays missing past the grace is, and so is one never seen.
import { defaultDegradation, type PoolConfig } from '@sluice/config';
import { keySpace } from '@sluice/protocol';
import { createRedis, redisReady, type Redis } from '@sluice/redis';
import { startRedis, type TestRedis } from '@sluice/test/support';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { HANDOVER_GRACE_MS, PoolQueue } from '../src/pool-queue.ts';

let server: TestRedis;
let redis: Redis;
let bull: Redis;
let queue: PoolQueue;
let clock = 0;
const keys = keySpace('sluice');
const lease = keys.lease('p');
const pool: PoolConfig = {
  name: 'p',
  models: ['m'],
  engines: [
    { name: 'e', url: 'http://127.0.0.1:1', maxInflight: 1, capSource: 'config', lane: 'any' },
  ],
  queueDepth: 3,
  maxParkSeconds: 10,
  degradation: defaultDegradation,
  longPrompts: {
    thresholdTokens: 8192,
    maxShare: 0.5,
    maxInPrefill: 1,
    agingSeconds: 60,
    kvFit: true,
  },
};

/** The lease reads of this test's connection, from Redis's own command counts. */
async function existsCalls(): Promise<number> {
  const info = await redis.info('commandstats');
  return Number(/cmdstat_exists:calls=(\d+)/.exec(info)?.[1] ?? 0);
}

beforeAll(async () => {
  server = await startRedis();
  redis = createRedis(server.url, { name: 'cmd', role: 'command' });
  bull = createRedis(server.url, { name: 'bull', role: 'bullmq' });
  await Promise.all([redisReady(redis), redisReady(bull)]);
});
beforeEach(async () => {
  await redis.flushall();
  clock = 1_000_000;
  queue = new PoolQueue(pool, keys, redis, bull, 10, () => clock);
});
afterEach(() => queue.close());
afterAll(async () => {
  await Promise.all([redis.quit(), bull.quit()]);
  await server.stop();
});

describe('leader presence across a hand-over', () => {
  it('refuses at once a pool whose lease it never saw (no dispatcher at all)', async () => {
    expect(await queue.hasLeader()).toBe(false);
    clock += 10 * HANDOVER_GRACE_MS;
    expect(await queue.hasLeader()).toBe(false);
  });

  it('a planned hand-over: the key deleted, then taken by a standby, refuses nobody', async () => {
    await redis.set(lease, 'd1', 'PX', 5000);
    expect(await queue.hasLeader()).toBe(true);
    // The leader's SIGTERM deletes the key; the gateway's cache runs out in the gap.
    await redis.del(lease);
    clock += 1000;
    expect(await queue.hasLeader()).toBe(true);
    clock += HANDOVER_GRACE_MS - 1;
    expect(await queue.hasLeader()).toBe(true);
    // The standby leads; the read at the grace's end finds it.
    await redis.set(lease, 'd2', 'PX', 5000);
    clock += 1;
    expect(await queue.hasLeader()).toBe(true);
    // And a later hand-over is forgiven again.
    await redis.del(lease);
    clock += 1000;
    expect(await queue.hasLeader()).toBe(true);
  });

  it('a crashed leader: its key expires, the standby takes it within the grace', async () => {
    await redis.set(lease, 'd1', 'PX', 50);
    expect(await queue.hasLeader()).toBe(true);
    // Redis ends the key itself, as for a leader that stopped renewing.
    while ((await redis.exists(lease)) === 1) await redis.ping();
    clock += 1000;
    expect(await queue.hasLeader()).toBe(true);
    await redis.set(lease, 'd2', 'PX', 5000);
    clock += HANDOVER_GRACE_MS;
    expect(await queue.hasLeader()).toBe(true);
  });

  it('refuses once the lease stays missing past the grace, until a leader is back', async () => {
    await redis.set(lease, 'd1', 'PX', 5000);
    expect(await queue.hasLeader()).toBe(true);
    await redis.del(lease);
    clock += 1000;
    expect(await queue.hasLeader()).toBe(true);
    clock += HANDOVER_GRACE_MS;
    expect(await queue.hasLeader()).toBe(false);
    // No second grace: the pool has no dispatcher, and stays refused.
    clock += 1000;
    expect(await queue.hasLeader()).toBe(false);
    // A dispatcher that starts is seen at the next read.
    await redis.set(lease, 'd3', 'PX', 5000);
    clock += 1000;
    expect(await queue.hasLeader()).toBe(true);
  });

  it('asks Redis once per cache period, however many requests ask at once', async () => {
    await redis.set(lease, 'd1', 'PX', 5000);
    await redis.config('RESETSTAT');
    expect(await Promise.all(Array.from({ length: 20 }, () => queue.hasLeader()))).toEqual(
      Array(20).fill(true),
    );
    expect(await existsCalls()).toBe(1);
    // In a hand-over too: the missing key is read once, and not again until the grace ends.
    await redis.del(lease);
    clock += 1000;
    await Promise.all(Array.from({ length: 20 }, () => queue.hasLeader()));
    clock += HANDOVER_GRACE_MS - 1;
    await Promise.all(Array.from({ length: 20 }, () => queue.hasLeader()));
    expect(await existsCalls()).toBe(2);
  });
});
