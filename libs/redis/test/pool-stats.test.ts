import { encodePoolStats, keySpace, type PoolStats } from '@sluice/protocol';
import { startRedis } from '@sluice/test/support';
import { describe, expect, it } from 'vitest';
import { createRedis, publishingPools, readPoolStats, redisReady } from '../src/index.ts';

const keys = keySpace('t');
const stats = (leader: string): PoolStats => ({
  leader,
  at: 1,
  drainPerSecond: 0.5,
  engines: [{ name: 'e', inflight: 1, cap: 4 }],
  queue: { wait: 3, prioritized: 0, active: 1 },
});

describe('published pool stats', () => {
  it('finds the publishing pools and reads each, naming missing and unreadable ones', async () => {
    const server = await startRedis();
    const redis = createRedis(server.url, { name: 'sluice:test:stats', role: 'command' });
    try {
      await redisReady(redis);
      await redis.set(keys.poolStats('b'), encodePoolStats(stats('d1')));
      await redis.set(keys.poolStats('a'), '{"leader":1}');
      // Not a stats key, and another prefix's: neither is a pool here.
      await redis.set('t:{pool-c}:lease', 'x');
      await redis.set(keySpace('other').poolStats('d'), encodePoolStats(stats('d2')));

      expect((await publishingPools(redis, keys)).sort()).toEqual(['a', 'b']);
      expect(await readPoolStats(redis, keys, ['b', 'a', 'none', 'b'])).toEqual([
        { pool: 'a', invalid: 'pool stats must have leader, at, drainPerSecond and engines' },
        { pool: 'b', stats: stats('d1') },
        { pool: 'none' },
      ]);
    } finally {
      redis.disconnect();
      await server.stop();
    }
  });
});
