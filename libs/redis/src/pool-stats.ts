// Reads what the leading dispatchers publish about their pools (keys.poolStats, a 5 s TTL),
// for every reader that shows it: `sluice status` and the dispatcher's /status page.
import { decodePoolStats, ProtocolError, type KeySpace, type PoolStats } from '@sluice/protocol';
import type { Redis } from './connect.js';
import { scanKeys } from './topology.js';

export interface PublishedPool {
  pool: string;
  /** Absent when nothing was published for 5 s (no leader) or what was is unreadable. */
  stats?: PoolStats;
  /** Why a published value could not be read. */
  invalid?: string;
}

/** Pools whose stats some dispatcher publishes now, whatever its config (every master of a Cluster). */
export async function publishingPools(redis: Redis, keys: KeySpace): Promise<string[]> {
  const pools: string[] = [];
  for (const key of await scanKeys(redis, keys.poolStatsPattern)) {
    const pool = keys.poolOfStatsKey(key);
    if (pool !== undefined) pools.push(pool);
  }
  return pools;
}

/**
 * Each named pool's published stats, sorted by name. One GET per pool: on a Cluster the pools
 * sit in different slots. A value that does not decode is named, not thrown, so that one bad
 * pool does not hide the others.
 */
export async function readPoolStats(
  redis: Redis,
  keys: KeySpace,
  pools: Iterable<string>,
): Promise<PublishedPool[]> {
  return Promise.all(
    [...new Set(pools)].sort().map(async (pool): Promise<PublishedPool> => {
      const text = await redis.get(keys.poolStats(pool));
      if (text === null) return { pool };
      try {
        return { pool, stats: decodePoolStats(text) };
      } catch (err) {
        if (err instanceof ProtocolError) return { pool, invalid: err.message };
        throw err;
      }
    }),
  );
}
