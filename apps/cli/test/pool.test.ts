// `sluice pool` against a real redis-server, with the leader played by the test: a snapshot
// that does not change during the wait is a dead leader's leftover (the stats key outlives its
// last publication by its 5 s TTL) and must not be named as the leader in charge; one that a
// leader publishes during the wait is. Every step waits for an event (the command's control
// message, its answer), never for time to pass.
import { encodePoolStats, keySpace, type PoolStats } from '@sluice/protocol';
import { createRedis, redisReady, type Redis } from '@sluice/redis';
import { startRedis, type TestRedis } from '@sluice/test/support';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { liveLeader, poolCommand } from '../src/pool.ts';

const keys = keySpace('sluice');
let server: TestRedis;
let redis: Redis;

beforeAll(async () => {
  server = await startRedis();
  redis = createRedis(server.url, { name: 'pool-test', role: 'command' });
  await redisReady(redis);
});

afterAll(async () => {
  redis?.disconnect();
  await server?.stop();
});

/** A snapshot as a leader publishes it, `ageMs` old by this machine's clock. */
function snapshot(leader: string, ageMs: number): PoolStats {
  return { leader, at: Date.now() - ageMs, drainPerSecond: 0, mode: 'open', engines: [] };
}

/** Runs `sluice pool ARGV` on the pool `default` (VLLM_URL configures it). */
async function sluicePool(
  argv: string[],
): Promise<{ code: number; stdout: string; stderr: string }> {
  let stdout = '';
  let stderr = '';
  const code = await poolCommand(argv, {
    env: { REDIS_URL: server.url, VLLM_URL: 'http://127.0.0.1:9', VLLM_MODEL: 'm' },
    stdout: { write: (text: string) => (stdout += text) },
    stderr: { write: (text: string) => (stderr += text) },
  });
  return { code, stdout, stderr };
}

/** Runs `act` once the command has named the pool on the control channel. */
async function onControl(act: () => Promise<unknown>): Promise<() => void> {
  const subscriber = createRedis(server.url, { name: 'pool-test-sub', role: 'subscriber' });
  subscriber.on('message', () => void act());
  await subscriber.subscribe(keys.controlChannel);
  return () => subscriber.disconnect();
}

describe('sluice pool with no live leader', () => {
  it("names a dead leader's leftover snapshot as the last leader, not as the one leading", async () => {
    // The leader died 3 s ago; its last snapshot has not expired yet.
    const stale = snapshot('dispatcher-gone', 3000);
    await redis.set(keys.poolStats('default'), encodePoolStats(stale), 'PX', 60_000);
    const { code, stdout, stderr } = await sluicePool(['pause', 'default', '--timeout', '0.3']);
    expect({ code, stdout }).toEqual({ code: 1, stdout: '' });
    const m =
      /^sluice pool: pool default is set to paused in Redis, but no dispatcher leads it \(last leader dispatcher-gone, (\d+) s ago\) after 0\.3 s; the mode applies when a leader reads it\n$/.exec(
        stderr,
      );
    expect(m, stderr).not.toBeNull();
    expect(Number(m![1])).toBeGreaterThanOrEqual(3);
  });

  it('still names the last leader once its snapshot expires during the wait', async () => {
    await redis.set(
      keys.poolStats('default'),
      encodePoolStats(snapshot('dispatcher-gone', 4000)),
      'PX',
      60_000,
    );
    // The key's TTL runs out while the command waits.
    const stop = await onControl(() => redis.del(keys.poolStats('default')));
    try {
      const { code, stderr } = await sluicePool(['drain', 'default', '--timeout', '0.3']);
      expect(code).toBe(1);
      expect(stderr).toMatch(
        /^sluice pool: pool default is set to draining in Redis, but no dispatcher leads it \(last leader dispatcher-gone, \d+ s ago\) after 0\.3 s; .* \(gateways refuse new requests already\)\n$/,
      );
    } finally {
      stop();
    }
  });

  it('names a leader that published during the wait as the leader, even one that ignores the mode', async () => {
    // Old by the clock, so only its publication during the wait shows it alive.
    const first = snapshot('dispatcher-alive', 3000);
    await redis.set(keys.poolStats('default'), encodePoolStats(first), 'PX', 60_000);
    const stop = await onControl(() =>
      redis.set(
        keys.poolStats('default'),
        encodePoolStats({ ...first, at: first.at + 1 }),
        'PX',
        60_000,
      ),
    );
    try {
      const { code, stderr } = await sluicePool(['pause', 'default', '--timeout', '1']);
      expect(code).toBe(1);
      expect(stderr).toBe(
        'sluice pool: pool default is set to paused in Redis, but its leader dispatcher-alive still shows open after 1 s; the mode applies when a leader reads it\n',
      );
    } finally {
      stop();
    }
  });

  it('counts a snapshot younger than two publications as live when the wait saw none', () => {
    const now = 100_000;
    const stats = snapshot('d', 0);
    expect(liveLeader({ ...stats, at: now - 1500 }, now - 1500, now)).toBe(true);
    expect(liveLeader({ ...stats, at: now - 2500 }, now - 2500, now)).toBe(false);
    // Published during the wait (or first seen in it): live, however old by this clock.
    expect(liveLeader({ ...stats, at: now - 9000 }, now - 9001, now)).toBe(true);
    expect(liveLeader({ ...stats, at: now - 9000 }, undefined, now)).toBe(true);
  });
});

describe('a pool drained while no dispatcher leads it', () => {
  // No configuration names the pool and no dispatcher publishes for it: only its control key
  // says it exists (`sluice pool drain` ran while its leader was gone).
  async function bare(argv: string[]) {
    let stdout = '';
    let stderr = '';
    const code = await poolCommand(argv, {
      env: { REDIS_URL: server.url },
      stdout: { write: (text: string) => (stdout += text) },
      stderr: { write: (text: string) => (stderr += text) },
    });
    return { code, stdout, stderr };
  }

  it('is known by its control key: resume opens it', async () => {
    await redis.flushall();
    await redis.set(keys.poolControl('default'), 'draining');
    await redis.set(keys.poolControl('other'), 'paused');
    const { code, stderr } = await bare(['resume', 'default', '--timeout', '0.3']);
    // Opened in Redis (the key gone: gateways stop refusing pool_draining); no leader shows it.
    expect(await redis.exists(keys.poolControl('default'))).toBe(0);
    expect(await redis.get(keys.poolControl('other'))).toBe('paused');
    expect({ code, stderr }).toEqual({
      code: 1,
      stderr:
        'sluice pool: pool default is set to open in Redis, but no dispatcher leads it after 0.3 s; the mode applies when a leader reads it\n',
    });
  });

  it('keys of other prefixes or shapes name no pool', async () => {
    await redis.flushall();
    await redis.set(keySpace('elsewhere').poolControl('default'), 'draining');
    await redis.set('sluice:{pool-a}:b}:control', 'draining');
    const { code, stderr } = await bare(['resume', 'default', '--timeout', '0.3']);
    expect({ code, stderr }).toEqual({
      code: 2,
      stderr:
        'sluice pool: unknown pool "default": none is configured (VLLM_URL, SLUICE_CONFIG), published by a dispatcher or paused or draining\n',
    });
  });
});
