// `sluice pool pause|resume|drain NAME`: sets a pool's operator mode (docs/operations.md,
// "Pool controls"). The mode lives under the pool's control key; the command names the pool
// on the control channel so the dispatchers read it at once, then waits until the leader's
// published stats show the new mode: when it prints, the mode is in force. A snapshot that
// did not change during the wait is a dead leader's leftover (the key outlives it by 5 s),
// and is named as such, never as the leader.
import { parseArgs } from 'node:util';
import { ConfigError, loadConfig } from '@sluice/config';
import {
  decodePoolStats,
  isKeyPart,
  keySpace,
  type KeySpace,
  type PoolMode,
  type PoolStats,
} from '@sluice/protocol';
import {
  createRedis,
  publishingPools,
  redisReady,
  RedisTlsError,
  scanKeys,
  type Redis,
} from '@sluice/redis';

export const poolUsage = `Usage: sluice pool pause|resume|drain NAME [--timeout SECONDS]

  pause    the leader stops releasing; gateways keep queueing up to the queue bound
  resume   releases restart; gateways take new requests again (ends a drain too)
  drain    gateways refuse new requests (503 pool_draining); the leader finishes the queue

  --timeout SECONDS   how long to wait for the leader to show the mode (default 10)
`;

const targets = { pause: 'paused', resume: 'open', drain: 'draining' } as const;
export type PoolAction = keyof typeof targets;

export interface PoolCommand {
  action: PoolAction;
  pool: string;
  timeoutMs: number;
}

/** Bad usage: printed as one line, exit 2. */
export class UsageError extends Error {}

/** Reads the command line strictly; `help` when asked for it. */
export function parsePoolArgs(argv: string[]): PoolCommand | 'help' {
  let parsed;
  try {
    parsed = parseArgs({
      args: argv,
      options: { timeout: { type: 'string' }, help: { type: 'boolean', short: 'h' } },
      allowPositionals: true,
      strict: true,
    });
  } catch (err) {
    throw new UsageError(err instanceof Error ? err.message : String(err));
  }
  if (parsed.values.help) return 'help';
  const [action, pool, ...extra] = parsed.positionals;
  if (action === undefined) throw new UsageError('expected an action: pause, resume or drain');
  if (!Object.hasOwn(targets, action))
    throw new UsageError(
      `unknown action ${JSON.stringify(action)}: expected pause, resume or drain`,
    );
  if (pool === undefined) throw new UsageError(`expected the pool to ${action}`);
  if (extra.length > 0) throw new UsageError(`unexpected argument ${JSON.stringify(extra[0])}`);
  let timeoutMs = 10_000;
  if (parsed.values.timeout !== undefined) {
    const seconds = Number(parsed.values.timeout);
    if (!Number.isFinite(seconds) || seconds <= 0)
      throw new UsageError(
        `--timeout=${JSON.stringify(parsed.values.timeout)} is invalid: expected seconds > 0`,
      );
    timeoutMs = seconds * 1000;
  }
  return { action: action as PoolAction, pool, timeoutMs };
}

/** The line printed once the leader shows the mode. */
export function doneLine(pool: string, mode: PoolMode, stats: PoolStats): string {
  const q = stats.queue;
  const queued = q ? q.wait + q.prioritized + (q.delayed ?? 0) : undefined;
  const what =
    mode === 'paused'
      ? 'paused: the leader releases nothing; requests queue up to the bound'
      : mode === 'draining'
        ? 'draining: gateways refuse new requests; the leader finishes the queue'
        : 'open: releasing and taking new requests';
  return `pool ${pool} ${what} (leader ${stats.leader}${queued === undefined ? '' : `, ${queued} queued`})\n`;
}

/** How often the leader publishes its snapshot (apps/dispatcher pool-dispatcher.ts). */
const PUBLISH_MS = 1000;

/**
 * Whether the snapshot read at the end of a wait is a live leader's: it was published during
 * the wait (its `at` is not the one read before it, `firstAt`), or it is fresh (younger than
 * two publications by this machine's clock, for a wait too short to see the next one).
 * Otherwise it is what a dead leader left behind: the key outlives its last publication by
 * its 5 s TTL, and that leader must not be named as the one leading now.
 */
export function liveLeader(stats: PoolStats, firstAt: number | undefined, now: number): boolean {
  return stats.at !== firstAt || now - stats.at < 2 * PUBLISH_MS;
}

/** The reason given when the mode is not shown by the end of the wait. */
export function timeoutLine(
  pool: string,
  mode: PoolMode,
  timeoutMs: number,
  last: { stats: PoolStats; live: boolean; now: number } | undefined,
): string {
  let who: string;
  if (last === undefined) who = 'no dispatcher leads it';
  else if (last.live)
    who = `its leader ${last.stats.leader} still shows ${last.stats.mode ?? 'open'}`;
  else {
    const ago = Math.max(0, Math.round((last.now - last.stats.at) / 1000));
    who = `no dispatcher leads it (last leader ${last.stats.leader}, ${ago} s ago)`;
  }
  return (
    `pool ${pool} is set to ${mode} in Redis, but ${who} after ${timeoutMs / 1000} s; ` +
    'the mode applies when a leader reads it' +
    (mode === 'draining' ? ' (gateways refuse new requests already)' : '')
  );
}

/** A pool name that stands for "any" while the control key's pattern is cut out of its definition. */
const ANY_POOL = 'sluice-any-pool';

/**
 * Pools whose operator mode is set in Redis (their control key exists: paused or draining),
 * with that mode, whatever the configuration names and whether a dispatcher leads them. A pool
 * drained while no dispatcher leads it publishes no stats, and would otherwise be unknown to
 * `sluice pool` and `sluice status` although its gateways refuse new requests: its operator
 * could not resume it. The SCAN pattern and the parse are cut from the key's one definition
 * (keys.poolControl); a key whose middle is not a pool name that builds the same key is not
 * a pool's.
 */
export async function controlledPools(redis: Redis, keys: KeySpace): Promise<Map<string, string>> {
  const [head, tail] = keys.poolControl(ANY_POOL).split(ANY_POOL) as [string, string];
  const glob = (text: string) => text.replace(/[*?[\]\\]/g, '\\$&');
  const pools = [];
  for (const key of await scanKeys(redis, `${glob(head)}*${glob(tail)}`)) {
    if (!key.startsWith(head) || !key.endsWith(tail)) continue;
    const pool = key.slice(head.length, key.length - tail.length);
    if (isKeyPart(pool) && keys.poolControl(pool) === key) pools.push(pool);
  }
  // One GET per pool: on a Cluster the pools sit in different slots. A key gone since the
  // SCAN (a resume meanwhile) leaves its pool out.
  const found = new Map<string, string>();
  await Promise.all(
    pools.map(async (pool) => {
      const mode = await redis.get(keys.poolControl(pool));
      if (mode !== null) found.set(pool, mode);
    }),
  );
  return found;
}

export interface PoolIo {
  env: NodeJS.ProcessEnv;
  stdout: { write(text: string): unknown };
  stderr: { write(text: string): unknown };
}

export async function runPool(argv: string[]): Promise<void> {
  const code = await poolCommand(argv, {
    env: process.env,
    stdout: process.stdout,
    stderr: process.stderr,
  });
  if (code !== 0) process.exitCode = code;
}

/** `sluice pool ...`; resolves with the exit code. */
export async function poolCommand(argv: string[], io: PoolIo): Promise<number> {
  const fail = (message: string, code: number) => {
    io.stderr.write(`sluice pool: ${message}\n`);
    return code;
  };
  let command: PoolCommand | 'help';
  let config;
  let redis: Redis;
  try {
    command = parsePoolArgs(argv);
    if (command === 'help') {
      io.stdout.write(poolUsage);
      return 0;
    }
    config = loadConfig(io.env);
    // Reads REDIS_TLS_CA_FILE: a file that cannot be read is a configuration refused, as an
    // unreadable SLUICE_CONFIG is, not a failure of the command.
    redis = createRedis(config.redis, { name: 'sluice:pool', role: 'command' });
  } catch (err) {
    if (err instanceof UsageError || err instanceof ConfigError || err instanceof RedisTlsError)
      return fail(err.message, 2);
    throw err;
  }
  const { action, pool, timeoutMs } = command;
  const keys = keySpace(config.redis.prefix);
  redis.on('error', () => {});
  try {
    await redisReady(redis, 3000);
    // Pools this configuration names, pools some dispatcher publishes stats for, and pools
    // whose mode is set (one drained while leaderless must still be resumable).
    const known = [
      ...new Set([
        ...config.pools.map((p) => p.name),
        ...(await publishingPools(redis, keys)),
        ...(await controlledPools(redis, keys)).keys(),
      ]),
    ].sort();
    if (!known.includes(pool))
      return fail(
        `unknown pool ${JSON.stringify(pool)}: ` +
          (known.length === 0
            ? 'none is configured (VLLM_URL, SLUICE_CONFIG), published by a dispatcher or paused or draining'
            : `expected one of ${known.join(', ')}`),
        2,
      );
    const mode = targets[action];
    const read = async () => {
      const text = await redis.get(keys.poolStats(pool));
      return text ? decodePoolStats(text) : undefined;
    };
    // Only a snapshot published after the write counts: one from before it may show the mode
    // an earlier command set and the leader has not yet left.
    const before = (await read())?.at;
    // Open is the key's absence: a resume leaves nothing behind.
    if (mode === 'open') await redis.del(keys.poolControl(pool));
    else await redis.set(keys.poolControl(pool), mode);
    await redis.publish(keys.controlChannel, pool);
    const deadline = Date.now() + timeoutMs;
    // The last snapshot seen: once the key has expired, it still names the last leader.
    let last: PoolStats | undefined;
    for (;;) {
      const stats = await read();
      if (stats && stats.at !== before && (stats.mode ?? 'open') === mode) {
        io.stdout.write(doneLine(pool, mode, stats));
        return 0;
      }
      last = stats ?? last;
      const at = Date.now();
      if (at >= deadline) {
        const live = stats !== undefined && liveLeader(stats, before, at);
        return fail(timeoutLine(pool, mode, timeoutMs, last && { stats: last, live, now: at }), 1);
      }
      // The leader publishes at once when it applies the mode, and each second anyway.
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
  } finally {
    redis.disconnect();
  }
}
