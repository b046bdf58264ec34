// `sluice status`: what the leading dispatchers published about each pool, read from Redis.
import { loadConfig, type RedisTopology } from '@sluice/config';
import { decodePoolStats, keySpace, type PoolStats } from '@sluice/protocol';
import {
  createRedis,
  describeTopology,
  isCluster,
  redisReady,
  scanKeys,
  sentinelMaster,
  type Redis,
} from '@sluice/redis';

/**
 * The first line: which Redis this is, and where its master is now. The sentinels are asked
 * directly (a connection alone does not say which node it reached); a cluster says how many
 * masters share the pools.
 */
export async function redisLine(topology: RedisTopology, redis: Redis): Promise<string> {
  let where = '';
  if (topology.kind === 'sentinel')
    where = await sentinelMaster(topology).then(
      (master) => `  master ${master}`,
      (err: unknown) => `  master unknown (${err instanceof Error ? err.message : String(err)})`,
    );
  else if (isCluster(redis)) where = `  ${redis.nodes('master').length} masters`;
  return `redis: ${describeTopology(topology)}${where}\n`;
}

export function formatStatus(
  pools: ReadonlyArray<{ pool: string; stats: PoolStats | undefined }>,
  now: number,
): string {
  if (pools.length === 0)
    return 'no pools: no dispatcher has published any (is one running against this Redis?)\n';
  const lines: string[] = [];
  for (const { pool, stats } of pools) {
    if (!stats) {
      lines.push(`pool ${pool}: no leader (no dispatcher has published for 5 s)`);
      continue;
    }
    const q = stats.queue;
    lines.push(
      `pool ${pool}  leader ${stats.leader}  drain ${stats.drainPerSecond.toFixed(2)}/s` +
        (stats.loadState ? `  load ${stats.loadState}` : '') +
        (q
          ? `  queue: wait ${q.wait} prioritized ${q.prioritized} active ${q.active}` +
            (q.delayed === undefined ? '' : ` held ${q.delayed}`)
          : ''),
    );
    const longs = stats.longs;
    if (longs && (longs.held > 0 || longs.inPrefill > 0 || longs.prefillTokensPerSecond))
      lines.push(
        `  long prompts: ${longs.held} held (${longs.heldTokens} tokens), ${longs.inPrefill} in prefill` +
          (longs.prefillTokensPerSecond === undefined
            ? ''
            : `, prefill ${Math.round(longs.prefillTokensPerSecond)} tok/s`),
      );
    lines.push(...tenantLines(stats));
    for (const e of stats.engines) {
      const gate =
        e.open === undefined
          ? ''
          : e.open
            ? '  gate open'
            : `  gate closed (${e.reason ?? 'unknown'})`;
      const gauges =
        e.running === undefined
          ? '  gauges: none yet'
          : `  running ${e.running} waiting ${e.waiting} kv ${((e.kvUsage ?? 0) * 100).toFixed(1)}%` +
            (e.scrapedAt === undefined
              ? ''
              : `  read ${((now - e.scrapedAt) / 1000).toFixed(1)} s ago`);
      lines.push(
        `  engine ${e.name}  in-flight ${e.inflight}/${e.cap}${gate}  state ${e.health ?? 'unknown'}${gauges}`,
      );
    }
  }
  return `${lines.join('\n')}\n`;
}

/**
 * One line per tenant: queue depth, in flight with its share of the pool's running work, its
 * weight, and its fair-share counter (the tenant with work and the least goes next).
 */
function tenantLines(stats: PoolStats): string[] {
  const tenants = Object.entries(stats.tenants ?? {});
  const running = tenants.reduce((sum, [, t]) => sum + t.inflight, 0);
  return tenants.map(
    ([name, t]) =>
      `  tenant ${name}  queued ${t.queued}  in-flight ${t.inflight}` +
      ` (${running === 0 ? 0 : Math.round((t.inflight / running) * 100)}% of running)` +
      `  weight ${t.weight}  virtual tokens ${Math.round(t.virtualTokens)}`,
  );
}

export async function runStatus(argv: string[]): Promise<void> {
  const json = argv.includes('--json');
  const config = loadConfig(process.env);
  const keys = keySpace(config.redis.prefix);
  const redis = createRedis(config.redis, { name: 'sluice:status', role: 'command' });
  redis.on('error', () => {});
  try {
    await redisReady(redis, 3000);
    const names = new Set(config.pools.map((p) => p.name));
    // Pools no dispatcher of this config leads may still publish: list them too. On a
    // Cluster each master holds the stats of its own pools, so each is scanned.
    for (const key of await scanKeys(redis, keys.poolStatsPattern)) {
      const pool = keys.poolOfStatsKey(key);
      if (pool !== undefined) names.add(pool);
    }
    const pools = await Promise.all(
      [...names].sort().map(async (pool) => {
        const text = await redis.get(keys.poolStats(pool));
        return { pool, stats: text ? decodePoolStats(text) : undefined };
      }),
    );
    // --json stays the list of pools it always was; the topology is for people.
    process.stdout.write(
      json
        ? `${JSON.stringify(pools)}\n`
        : (await redisLine(config.redis, redis)) + formatStatus(pools, Date.now()),
    );
  } finally {
    redis.disconnect();
  }
}
