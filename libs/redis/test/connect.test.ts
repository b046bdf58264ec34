import { eventually, startRedis } from '@sluice/test/support';
import { Redis as Admin } from 'ioredis';
import { describe, expect, it, vi } from 'vitest';
import { createRedis, RedisAuthError, redisHealthy, redisReady, type Redis } from '../src/index.ts';

/**
 * Ends `redis` the way ioredis's Sentinel failover detector can on +switch-master: it tells the
 * connector to disconnect, and here that lands while the connection is connecting again.
 * Resolves once ioredis has ended the connection.
 */
function endWhileReconnecting(redis: Redis): Promise<void> {
  const connector = (redis as unknown as { connector: { disconnect(): void } }).connector;
  redis.once('connecting', () => connector.disconnect());
  const ended = new Promise<void>((resolve) => redis.once('end', () => resolve()));
  redis.disconnect(true);
  return ended;
}

describe('redis connections', () => {
  it('connects, reports healthy, and reports unhealthy once the server is gone', async () => {
    const server = await startRedis();
    const redis = createRedis(server.url, { name: 'sluice:test:1:command', role: 'command' });
    redis.on('error', () => {});
    await redisReady(redis);
    expect(await redisHealthy(redis)).toBe(true);
    expect(await redis.client('GETNAME')).toBe('sluice:test:1:command');
    await server.stop();
    expect(await redisHealthy(redis, 200)).toBe(false);
    redis.disconnect();
  });

  it('comes back when ioredis ends it by itself while reconnecting', async () => {
    const server = await startRedis();
    const redis = createRedis(server.url, { name: 'x', role: 'command' });
    redis.on('error', () => {});
    try {
      await redisReady(redis);
      const back = new Promise((resolve) => redis.once('ready', resolve));
      await endWhileReconnecting(redis);
      await back;
      expect(await redis.ping()).toBe('PONG');
    } finally {
      redis.disconnect();
      await server.stop();
    }
  });

  it('comes back subscribed to its channels', async () => {
    const server = await startRedis();
    const sub = createRedis(server.url, { name: 'x', role: 'subscriber' });
    const pub = createRedis(server.url, { name: 'y', role: 'command' });
    sub.on('error', () => {});
    try {
      await Promise.all([redisReady(sub), redisReady(pub)]);
      await sub.subscribe('replies');
      await endWhileReconnecting(sub);
      const heard = new Promise((resolve) => sub.once('message', (_channel, m) => resolve(m)));
      await eventually(
        async () => ((await pub.publish('replies', 'frame')) === 1 ? true : undefined),
        'the subscriber back on its channel',
      );
      expect(await heard).toBe('frame');
    } finally {
      sub.disconnect();
      pub.disconnect();
      await server.stop();
    }
  });

  it('stays closed once quit or disconnected', async () => {
    const server = await startRedis();
    try {
      for (const close of ['quit', 'disconnect'] as const) {
        const redis = createRedis(server.url, { name: 'x', role: 'bullmq' });
        redis.on('error', () => {});
        await redisReady(redis);
        // Whatever would bring it back waits on a timer: run every timer to its end.
        vi.useFakeTimers({ toFake: ['setTimeout'] });
        try {
          const ended = new Promise((resolve) => redis.once('end', resolve));
          await redis[close]();
          await ended;
          vi.runAllTimers();
          expect(redis.status).toBe('end');
        } finally {
          vi.useRealTimers();
        }
        await expect(redis.ping()).rejects.toThrow('Connection is closed.');
      }
    } finally {
      await server.stop();
    }
  });

  it('gives BullMQ connections no per-request retry limit, as BullMQ requires', () => {
    const redis = createRedis('redis://127.0.0.1:1', { name: 'x', role: 'bullmq' });
    redis.on('error', () => {});
    expect(redis.options.maxRetriesPerRequest).toBeNull();
    redis.disconnect();
  });

  it('names the address when Redis cannot be reached in time', async () => {
    const redis = createRedis('redis://127.0.0.1:1', { name: 'x', role: 'command' });
    redis.on('error', () => {});
    await expect(redisReady(redis, 200)).rejects.toThrow(
      'Redis at 127.0.0.1:1 not reachable within 200 ms',
    );
    redis.disconnect();
  });
});

describe('redis credentials', () => {
  it('reports a wrong password as such, not as unreachable', async () => {
    const server = await startRedis({ password: 'right' });
    try {
      const url = `redis://:wrong@127.0.0.1:${server.port}`;
      const redis = createRedis(url, { name: 'x', role: 'command' });
      redis.on('error', () => {});
      const ready = redisReady(redis);
      await expect(ready).rejects.toBeInstanceOf(RedisAuthError);
      await expect(ready).rejects.toThrow(/refused the credentials: WRONGPASS/);
      redis.disconnect();
    } finally {
      await server.stop();
    }
  });

  it('waits for a Redis that appears later when no time limit is given', async () => {
    const { freePort } = await import('@sluice/test/support');
    const port = await freePort();
    const redis = createRedis(`redis://127.0.0.1:${port}`, { name: 'x', role: 'command' });
    redis.on('error', () => {});
    const ready = redisReady(redis);
    const server = await startRedis({ port });
    try {
      await ready;
      expect(await redis.ping()).toBe('PONG');
    } finally {
      redis.disconnect();
      await server.stop();
    }
  });
});

describe('a master demoted under a single-node connection', () => {
  // A managed service's "primary endpoint" is a DNS name that moves to the new master on
  // failover, but an open connection stays on the old master, which, demoted, answers every
  // write with READONLY for good. Here A is that old master: made a replica of B under the
  // connection. The write must lead to a reconnect (where the name would be resolved again),
  // not to READONLY for the caller.
  it.each(['command', 'bullmq'] as const)(
    '%s: a write that meets READONLY reconnects, and is resent',
    async (role) => {
      const [a, b] = await Promise.all([startRedis(), startRedis()]);
      const admin = new Admin(a.url);
      const redis = createRedis(a.url, { name: `sluice:test:${role}`, role });
      redis.on('error', () => {});
      try {
        await redisReady(redis);
        expect(await redis.set('k', 'before')).toBe('OK');
        // The data travels by socket only (no RDB file written in the working directory), and
        // B sends it at once, not after the default 5 s wait for more replicas.
        await admin.config('SET', 'repl-diskless-load', 'swapdb');
        const adminB = new Admin(b.url);
        await adminB
          .config('SET', 'repl-diskless-sync', 'yes', 'repl-diskless-sync-delay', '0')
          .finally(() => adminB.quit());
        await admin.replicaof('127.0.0.1', b.port);
        // Synced, so A answers READONLY (not LOADING) from here on.
        await eventually(
          async () => (await admin.info('replication')).includes('master_link_status:up'),
          'A to be a synced replica of B',
        );

        const reconnected = new Promise<string>((resolve) =>
          redis.once('reconnecting', () => redis.once('ready', () => resolve('reconnected'))),
        );
        const write = redis.set('k', 'after');
        const outcome = write.then(
          () => 'written',
          (err: Error) => err.message,
        );
        // Without the reconnect the caller hears READONLY at once.
        expect(await Promise.race([reconnected, outcome])).toBe('reconnected');

        // The failover ends: A is the master again, as a moved name would point at one.
        await admin.replicaof('NO', 'ONE');
        if (role === 'bullmq') expect(await write).toBe('OK');
        else await outcome; // resent until A took it, or the role's 1 s bound: either is fine
        expect(await redis.set('k', 'again')).toBe('OK');
        expect(await admin.get('k')).toBe('again');
      } finally {
        redis.disconnect();
        admin.disconnect();
        await Promise.all([a.stop(), b.stop()]);
      }
    },
  );
});
