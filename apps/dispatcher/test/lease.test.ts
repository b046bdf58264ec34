// The lease against a real redis-server: one leader, renewal, loss, takeover.
import { createRedis, redisReady, type Redis } from '@sluice/redis';
import { startRedis, type TestRedis } from '@sluice/test/support';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { Lease, type LeaseOptions } from '../src/lease.ts';

let server: TestRedis;
let redis: Redis;
const leases: Lease[] = [];

beforeAll(async () => {
  server = await startRedis();
  redis = createRedis(server.url, { name: 'test', role: 'command' });
  await redisReady(redis);
});
afterEach(async () => {
  await Promise.all(leases.splice(0).map((l) => l.stop()));
  await redis.flushall();
});
afterAll(async () => {
  await redis.quit();
  await server.stop();
});

/** A lease whose transitions resolve promises, so tests wait for events, not time. */
function lease(owner: string, ttlMs = 300, key = 'lease:p', options: LeaseOptions = {}) {
  let onAcquired!: () => void;
  let onLost!: () => void;
  const acquired = new Promise<void>((r) => (onAcquired = r));
  const lost = new Promise<void>((r) => (onLost = r));
  const l = new Lease(
    redis,
    key,
    owner,
    ttlMs,
    { acquired: () => onAcquired(), lost: () => onLost() },
    () => {},
    options,
  );
  leases.push(l);
  const firstAttempt = l.start();
  return { lease: l, acquired, lost, firstAttempt };
}

describe('lease', () => {
  it('makes exactly one of two contenders the leader', async () => {
    const a = lease('a');
    await a.acquired;
    const b = lease('b');
    await b.firstAttempt;
    expect(a.lease.isLeader).toBe(true);
    expect(b.lease.isLeader).toBe(false);
    expect(await redis.get('lease:p')).toBe('a');
    expect(await redis.pttl('lease:p')).toBeGreaterThan(0);
  });

  it('stops leading at once when another owner holds the key', async () => {
    const a = lease('a');
    await a.acquired;
    await redis.set('lease:p', 'intruder', 'PX', 60_000);
    await a.lost;
    expect(a.lease.isLeader).toBe(false);
  });

  it('hands over to a standby once the leader stops renewing', async () => {
    const a = lease('a');
    await a.acquired;
    const b = lease('b');
    await a.lease.stop(); // releases the key: the standby takes it on its next poll
    await b.acquired;
    expect(await redis.get('lease:p')).toBe('b');
  });

  it('hands over after the TTL when the leader vanishes without releasing', async () => {
    await redis.set('lease:p', 'dead-leader', 'PX', 300);
    const b = lease('b');
    await b.acquired;
    expect(await redis.get('lease:p')).toBe('b');
  });

  it('takes at once a key that already holds its own id (an attempt that timed out on our side but landed)', async () => {
    await redis.set('lease:p', 'b', 'PX', 60_000);
    const b = lease('b', 60_000);
    await b.firstAttempt;
    expect(b.lease.isLeader).toBe(true);
    expect(await redis.pttl('lease:p')).toBeGreaterThan(0);
    const c = lease('c');
    await c.firstAttempt;
    expect(c.lease.isLeader).toBe(false);
  });

  it('does not try to take a free lease while mayAcquire says no, and takes it once it says yes', async () => {
    let may = false;
    const a = lease('a', 300, 'lease:p', { mayAcquire: () => may });
    await a.firstAttempt;
    expect(a.lease.isLeader).toBe(false);
    expect(await redis.get('lease:p')).toBeNull();
    may = true;
    await a.acquired;
    expect(await redis.get('lease:p')).toBe('a');
  });

  it('counts an attempt in flight: two free leases started together under a limit of one end with one led', async () => {
    // The limit of lease-choice.ts in miniature: nothing led or being taken (`leases` holds
    // each lease before it starts).
    const free = () => leases.every((l) => !l.isLeader && !l.isAcquiring);
    const p = lease('a', 60_000, 'lease:p', { mayAcquire: free });
    const q = lease('a', 60_000, 'lease:q', { mayAcquire: free });
    await Promise.all([p.firstAttempt, q.firstAttempt]);
    expect([p.lease.isLeader, q.lease.isLeader].filter(Boolean)).toHaveLength(1);
    expect(await redis.exists('lease:p', 'lease:q')).toBe(1);
  });
});
