// `sluice status`: what the leading dispatchers published about each pool, read from Redis;
// `--watch` redraws it every `--interval` seconds (status-watch.ts).
import { parseArgs } from 'node:util';
import { ConfigError, loadConfig, type RedisTopology, type SluiceConfig } from '@sluice/config';
import { keySpace, type KeySpace, type PoolStats } from '@sluice/protocol';
import {
  createRedis,
  describeTopology,
  isCluster,
  publishingPools,
  readPoolStats,
  redisReady,
  RedisTlsError,
  sentinelMaster,
  type PublishedPool,
  type Redis,
} from '@sluice/redis';
import { controlledPools } from './pool.js';

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

/**
 * A pool as `sluice status` shows it: what its leader published, and, for a pool none
 * publishes for, the operator's mode set in Redis (`control`: paused or draining), which no
 * leader has applied or shown.
 */
export interface StatusPool extends PublishedPool {
  control?: string;
}

export function formatStatus(pools: ReadonlyArray<StatusPool>, now: number): string {
  if (pools.length === 0)
    return 'no pools: no dispatcher has published any (is one running against this Redis?)\n';
  const lines: string[] = [];
  for (const { pool, stats, invalid, control } of pools) {
    if (invalid !== undefined) {
      lines.push(`pool ${pool}: published stats unreadable (${invalid})`);
      continue;
    }
    if (!stats) {
      lines.push(
        `pool ${pool}: no leader (no dispatcher has published for 5 s)` +
          (control === undefined
            ? ''
            : `  mode ${control} in Redis (\`sluice pool resume ${pool}\` opens it)`),
      );
      continue;
    }
    const q = stats.queue;
    lines.push(
      `pool ${pool}` +
        (stats.mode ? `  mode ${stats.mode}` : '') +
        `  leader ${stats.leader}  drain ${stats.drainPerSecond.toFixed(2)}/s` +
        (stats.loadState ? `  load ${stats.loadState}` : '') +
        (q
          ? `  queue: wait ${q.wait} prioritized ${q.prioritized} active ${q.active}` +
            (q.delayed === undefined ? '' : ` held ${q.delayed}`)
          : '') +
        (stats.oldestQueuedMs === undefined
          ? ''
          : `  oldest ${(stats.oldestQueuedMs / 1000).toFixed(1)} s`),
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

/** Bad usage: printed as one line, exit 2. */
export class StatusUsageError extends Error {}

export interface StatusOptions {
  json: boolean;
  /** Refresh period of `--watch`, ms; absent: print once. */
  watchMs?: number;
}

/** The longest `--interval`, seconds. */
export const MAX_INTERVAL_SECONDS = 3600;

/** Reads `sluice status` flags strictly. */
export function parseStatusArgs(argv: string[]): StatusOptions {
  let values;
  try {
    ({ values } = parseArgs({
      args: argv,
      options: {
        json: { type: 'boolean' },
        watch: { type: 'boolean', short: 'w' },
        interval: { type: 'string' },
      },
      strict: true,
    }));
  } catch (err) {
    throw new StatusUsageError(err instanceof Error ? err.message : String(err));
  }
  if (values.interval !== undefined && !values.watch)
    throw new StatusUsageError('--interval goes with --watch');
  if (values.watch && values.json)
    throw new StatusUsageError('--watch and --json do not go together: --json prints once');
  if (!values.watch) return { json: values.json ?? false };
  let seconds = 1;
  if (values.interval !== undefined) {
    seconds = Number(values.interval);
    // Above 2^31-1 ms Node's setTimeout fires after 1 ms: a refresh loop hammering Redis. An
    // hour is far below that and past any use of a live view.
    if (!Number.isFinite(seconds) || seconds < 0.1 || seconds > MAX_INTERVAL_SECONDS)
      throw new StatusUsageError(
        `--interval=${JSON.stringify(values.interval)} is invalid: expected seconds from 0.1 to ${MAX_INTERVAL_SECONDS}`,
      );
  }
  return { json: false, watchMs: seconds * 1000 };
}

/**
 * Every pool this configuration names, some dispatcher publishes, or has its mode set in
 * Redis, with its stats; a pool without stats carries its mode (`control`), if set.
 */
export async function readPools(
  redis: Redis,
  keys: KeySpace,
  configured: readonly string[],
): Promise<StatusPool[]> {
  // Pools no dispatcher of this config leads may still publish, and a pool drained while no
  // dispatcher led it publishes nothing: list them too.
  const controlled = await controlledPools(redis, keys);
  const pools = await readPoolStats(redis, keys, [
    ...configured,
    ...(await publishingPools(redis, keys)),
    ...controlled.keys(),
  ]);
  return pools.map((p) => {
    const control = controlled.get(p.pool);
    return p.stats === undefined && control !== undefined ? { ...p, control } : p;
  });
}

export async function runStatus(argv: string[]): Promise<void> {
  let options: StatusOptions;
  let config: SluiceConfig;
  let redis: Redis;
  try {
    options = parseStatusArgs(argv);
    config = loadConfig(process.env);
    // Reads REDIS_TLS_CA_FILE: a file that cannot be read is a configuration refused, as an
    // unreadable SLUICE_CONFIG is, not a failure of the command.
    redis = createRedis(config.redis, { name: 'sluice:status', role: 'command' });
  } catch (err) {
    if (
      err instanceof StatusUsageError ||
      err instanceof ConfigError ||
      err instanceof RedisTlsError
    ) {
      process.stderr.write(`sluice status: ${err.message}\n`);
      process.exitCode = 2;
      return;
    }
    throw err;
  }
  const keys = keySpace(config.redis.prefix);
  redis.on('error', () => {});
  const configured = config.pools.map((p) => p.name);
  try {
    if (options.watchMs !== undefined) {
      const { watchStatus } = await import('./status-watch.js');
      return await watchStatus({
        intervalMs: options.watchMs,
        out: process.stdout,
        read: async () => {
          // Redis may come and go while watching: a frame says so instead of ending the view.
          await redisReady(redis, 3000);
          return {
            head: await redisLine(config.redis, redis),
            pools: await readPools(redis, keys, configured),
          };
        },
      });
    }
    await redisReady(redis, 3000);
    const pools = await readPools(redis, keys, configured);
    // --json stays the list of pools it always was; the topology is for people.
    process.stdout.write(
      options.json
        ? `${JSON.stringify(pools)}\n`
        : (await redisLine(config.redis, redis)) + formatStatus(pools, Date.now()),
    );
  } finally {
    redis.disconnect();
  }
}
