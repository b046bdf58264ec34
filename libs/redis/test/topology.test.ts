import { once } from 'node:events';
import type { RedisTopology } from '@sluice/config';
import { eventually, startCluster, startRedis } from '@sluice/test/support';
import { Cluster, Redis } from 'ioredis';
import { describe, expect, it } from 'vitest';
import {
  createRedis,
  describeTopology,
  RedisAuthError,
  redisHealthy,
  redisReady,
  RedisTlsError,
  scanKeys,
  sentinelMaster,
} from '../src/index.ts';
import { startOneNodeCluster, startSentinel } from './servers.ts';

const at = (port: number) => [{ host: '127.0.0.1', port }];

describe('Redis Cluster', () => {
  it('connects, runs commands and tagged pipelines, and scans every master', async () => {
    const node = await startOneNodeCluster();
    const redis = createRedis(
      { kind: 'cluster', nodes: at(node.port) },
      { name: 'sluice:test:cluster', role: 'command' },
    );
    redis.on('error', () => {});
    try {
      expect(redis).toBeInstanceOf(Cluster);
      await redisReady(redis);
      expect(await redisHealthy(redis)).toBe(true);
      const pipeline = redis.pipeline();
      for (const key of ['sluice:{pool-a}:x', 'sluice:{pool-a}:y']) pipeline.set(key, '1');
      expect(await pipeline.exec()).toEqual([
        [null, 'OK'],
        [null, 'OK'],
      ]);
      expect((await scanKeys(redis, 'sluice:{pool-a}:*')).sort()).toEqual([
        'sluice:{pool-a}:x',
        'sluice:{pool-a}:y',
      ]);
    } finally {
      redis.disconnect();
      await node.stop();
    }
  });

  it('runs EVALs of one turn on keys of different nodes: each goes to its own key', async () => {
    const cluster = await startCluster();
    const keys = ['sluice:{chat}:lease', 'sluice:{code}:lease', 'sluice:{x}:lease'];
    const owners = new Set(await Promise.all(keys.map((key) => cluster.nodeOf(key))));
    const redis = createRedis(
      { kind: 'cluster', nodes: at(cluster.nodes[0]!.port) },
      { name: 'sluice:test:cluster', role: 'command' },
    );
    redis.on('error', () => {});
    try {
      expect(owners.size).toBeGreaterThan(1);
      await redisReady(redis);
      const script = `return redis.call('set', KEYS[1], ARGV[1])`;
      const replies = await Promise.all(keys.map((key) => redis.eval(script, 1, key, key)));
      expect(replies).toEqual(['OK', 'OK', 'OK']);
      expect(await Promise.all(keys.map((key) => redis.get(key)))).toEqual(keys);
    } finally {
      redis.disconnect();
      await cluster.stop();
    }
  });

  it('follows a failover away from a master that hangs: the slot map is read again on its own', async () => {
    const cluster = await startCluster({ replicas: true });
    const key = 'sluice:{pool-default}:lease';
    const port = await cluster.nodeOf(key);
    const i = cluster.nodes.findIndex((n) => n.port === port);
    const master = cluster.nodes[i]!;
    const replica = new Redis({ host: '127.0.0.1', port: cluster.replicas[i]!.port });
    const redis = createRedis(
      { kind: 'cluster', nodes: at(cluster.nodes[(i + 1) % 3]!.port) },
      { name: 'sluice:test:cluster', role: 'command' },
    );
    redis.on('error', () => {});
    try {
      await redisReady(redis);
      expect(await redis.set(key, 'before')).toBe('OK');
      // A hung master (SIGSTOP) answers nothing and closes nothing: no MOVED, no closed
      // connection, so nothing else makes ioredis read the slot map again.
      master.process.child.kill('SIGSTOP');
      await eventually(
        async () => /^role:master\r?$/m.test(String(await replica.call('INFO', 'replication'))),
        'the replica to be promoted',
        60_000,
      );
      const written = await eventually(
        () => redis.set(key, 'after').catch(() => undefined),
        'a write to reach the promoted replica',
        30_000,
      );
      expect(written).toBe('OK');
      expect(await replica.get(key)).toBe('after');
    } finally {
      master.process.child.kill('SIGCONT');
      redis.disconnect();
      replica.disconnect();
      await cluster.stop();
    }
  }, 180_000);

  it('gives BullMQ cluster connections no per-request retry limit, where BullMQ reads it', () => {
    const redis = createRedis(
      { kind: 'cluster', nodes: at(1) },
      { name: 'x', role: 'bullmq' },
    ) as Cluster;
    redis.on('error', () => {});
    expect(redis.options.redisOptions?.maxRetriesPerRequest).toBeNull();
    redis.disconnect();
  });

  it('bounds a command while the whole cluster is away, as on one node', async () => {
    const node = await startOneNodeCluster();
    const redis = createRedis(
      { kind: 'cluster', nodes: at(node.port) },
      { name: 'x', role: 'command' },
    );
    redis.on('error', () => {});
    try {
      await redisReady(redis);
      // The command must meet a cluster the client knows is away: sent before the client saw
      // its connection close, it is written to the dying socket and fails with "Connection is
      // closed." instead (seen under load). The cluster's status goes to `close` once its
      // last node connection is gone.
      const away = once(redis, 'close');
      await node.stop();
      await away;
      await expect(redis.get('sluice:{pool-a}:x')).rejects.toThrow('Command timed out');
    } finally {
      redis.disconnect();
    }
  });

  it('reports a wrong password as such, not as unreachable', async () => {
    const node = await startOneNodeCluster('right');
    const redis = createRedis(
      { kind: 'cluster', nodes: at(node.port), password: 'wrong' },
      { name: 'x', role: 'command' },
    );
    redis.on('error', () => {});
    try {
      await expect(redisReady(redis)).rejects.toBeInstanceOf(RedisAuthError);
    } finally {
      redis.disconnect();
      await node.stop();
    }
  });
});

describe('Redis Sentinel', () => {
  it('finds the master through a sentinel, and names it', async () => {
    const master = await startRedis();
    const sentinel = await startSentinel('sluice-test', master.port);
    const topology: RedisTopology = {
      kind: 'sentinel',
      sentinels: at(sentinel.port),
      masterName: 'sluice-test',
    };
    const redis = createRedis(topology, { name: 'sluice:test:sentinel', role: 'command' });
    redis.on('error', () => {});
    try {
      await redisReady(redis);
      await redis.set('k', 'v');
      expect(await redis.call('CONFIG', 'GET', 'port')).toEqual(['port', String(master.port)]);
      expect(await sentinelMaster(topology)).toBe(`127.0.0.1:${master.port}`);
    } finally {
      redis.disconnect();
      await sentinel.stop();
      await master.stop();
    }
  });

  it('says so when no sentinel answers', async () => {
    await expect(
      sentinelMaster({ kind: 'sentinel', sentinels: at(1), masterName: 'm' }),
    ).rejects.toThrow(/^no sentinel named the master m \(127\.0\.0\.1:1: .+\)$/);
  });
});

describe('TLS and descriptions', () => {
  it('refuses to start without a readable CA file, naming it', () => {
    const create = () =>
      createRedis(
        { kind: 'single', url: 'rediss://127.0.0.1:1', tlsCaFile: '/nonexistent/ca.pem' },
        { name: 'x', role: 'command' },
      );
    expect(create).toThrow(RedisTlsError);
    expect(create).toThrow(/^REDIS_TLS_CA_FILE="\/nonexistent\/ca.pem" cannot be read: ENOENT/);
  });

  it('names each topology without its credentials', () => {
    expect(describeTopology({ kind: 'single', url: 'redis://:pw@r:6379' })).toBe(
      'single redis://***@r:6379',
    );
    // The host follows the last '@': ioredis logs in with `p@ss`, none of which is shown.
    expect(describeTopology({ kind: 'single', url: 'redis://u:p@ss@r:6379/2' })).toBe(
      'single redis://***@r:6379/2',
    );
    expect(
      describeTopology({
        kind: 'sentinel',
        sentinels: [
          { host: 's1', port: 26379 },
          { host: '::1', port: 26380 },
        ],
        masterName: 'm',
        sentinelPassword: 'pw',
      }),
    ).toBe('sentinel m via s1:26379,[::1]:26380');
    expect(
      describeTopology({ kind: 'cluster', nodes: at(7000), password: 'pw', tlsCaFile: '/ca.pem' }),
    ).toBe('cluster seeds 127.0.0.1:7000 (TLS, CA /ca.pem)');
  });
});
