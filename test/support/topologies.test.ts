// The topology harness on its own, with no Sluice in it: each deployment comes up from
// redis-server, behaves as the real thing does, and stops.
import { Redis } from 'ioredis';
import { describe, expect, it } from 'vitest';
import {
  aclArguments,
  askNode,
  fallbackAclRule,
  startAclRedis,
  startCluster,
  startSentinel,
  startTlsRedis,
} from './index.ts';

describe('topology harness', () => {
  it('Sentinel: the replica follows the master, and SIGKILL of the master promotes it', async () => {
    const sentinel = await startSentinel();
    const client = sentinel.client();
    try {
      expect(sentinel.env).toEqual({
        REDIS_SENTINELS: sentinel.sentinels.map((s) => `127.0.0.1:${s.port}`).join(','),
        REDIS_SENTINEL_MASTER: 'sluice',
      });
      expect(await sentinel.masterPort()).toBe(sentinel.master.port);
      await client.set('sluice:before', 'kept');
      // WAIT: the write reached the replica before the master dies (replication is async).
      expect(await client.call('WAIT', '1', '10000')).toBe(1);

      await sentinel.master.stop('SIGKILL');
      const promoted = await sentinel.waitForFailover(sentinel.master.port);
      expect(promoted).toBe(sentinel.replica.port);
      expect(await sentinel.masterPort()).toBe(sentinel.replica.port);
      // The sentinel-aware client follows the promotion by itself.
      expect(await client.get('sluice:before')).toBe('kept');
      await client.set('sluice:after', 'written');
      expect(await askNode(promoted, (r) => r.get('sluice:after'))).toBe('written');
    } finally {
      client.disconnect();
      await sentinel.stop();
    }
  });

  it('Cluster: three masters share the slots, say cluster_state:ok, and route a hash tag to one slot', async () => {
    const cluster = await startCluster();
    const client = cluster.client();
    try {
      expect(cluster.nodes).toHaveLength(3);
      for (const node of cluster.nodes) {
        const text = await askNode(node.port, (r) => r.call('CLUSTER', 'INFO').then(String));
        expect(text).toMatch(/^cluster_state:ok\r?$/m);
        expect(text).toMatch(/^cluster_slots_assigned:16384\r?$/m);
        expect(text).toMatch(/^cluster_known_nodes:3\r?$/m);
      }
      expect(cluster.env['REDIS_CLUSTER_NODES']).toBe(
        cluster.nodes.map((n) => `127.0.0.1:${n.port}`).join(','),
      );
      // Keys spread over every master; keys with one hash tag share a slot.
      const owners = new Set<number>();
      for (let i = 0; i < 30; i += 1) {
        await client.set(`spread-${i}`, String(i));
        owners.add(await cluster.nodeOf(`spread-${i}`));
      }
      expect(owners.size).toBe(3);
      expect(await cluster.keySlot('sluice:{pool-a}:wait')).toBe(
        await cluster.keySlot('sluice:{pool-a}:lease'),
      );
      expect(await cluster.keySlot('sluice:{pool-a}:wait')).toBe(await cluster.keySlot('{pool-a}'));
      // A multi-key command across two slots is refused: why Sluice needs the hash tags.
      await expect(client.mget('sluice:pool-a:wait', 'sluice:pool-a:lease')).rejects.toThrow(
        /CROSSSLOT/,
      );
      await expect(client.mget('sluice:{pool-a}:wait', 'sluice:{pool-a}:lease')).resolves.toEqual([
        null,
        null,
      ]);
    } finally {
      client.disconnect();
      await cluster.stop();
    }
  });

  it('Sentinel and Cluster with passwords: the data nodes and the sentinels refuse a client without one', async () => {
    const sentinel = await startSentinel({ password: 'data-pw', sentinelPassword: 'sentinel-pw' });
    const cluster = await startCluster({ password: 'cluster-pw' });
    const sentinelClient = sentinel.client();
    const clusterClient = cluster.client();
    try {
      expect(sentinel.env).toMatchObject({
        REDIS_PASSWORD: 'data-pw',
        REDIS_SENTINEL_PASSWORD: 'sentinel-pw',
      });
      expect(cluster.env).toMatchObject({ REDIS_PASSWORD: 'cluster-pw' });
      await sentinelClient.set('sluice:k', 'v');
      expect(await sentinelClient.get('sluice:k')).toBe('v');
      await clusterClient.set('sluice:k', 'v');
      expect(await clusterClient.get('sluice:k')).toBe('v');
      for (const port of [
        sentinel.master.port,
        sentinel.sentinels[0]!.port,
        cluster.nodes[0]!.port,
      ])
        await expect(askNode(port, (r) => r.call('CLIENT', 'ID'))).rejects.toThrow(/NOAUTH/);
    } finally {
      sentinelClient.disconnect();
      clusterClient.disconnect();
      await Promise.all([sentinel.stop(), cluster.stop()]);
    }
  });

  it('TLS: a client that trusts the test CA connects; one that does not, or speaks plain TCP, cannot', async () => {
    const server = await startTlsRedis({ password: 'tls-pw' });
    try {
      expect(server.env).toEqual({
        REDIS_URL: `rediss://:tls-pw@127.0.0.1:${server.port}`,
        REDIS_TLS_CA_FILE: server.certificates.caFile,
      });
      const trusted = await askNode(server.port, (r) => r.ping(), {
        password: 'tls-pw',
        tls: { ca: server.certificates.ca },
      });
      expect(trusted).toBe('PONG');
      await expect(
        askNode(server.port, (r) => r.ping(), { password: 'tls-pw', tls: {} }),
      ).rejects.toThrow(/self[- ]signed certificate in certificate chain/);
      await expect(askNode(server.port, (r) => r.ping(), { password: 'tls-pw' })).rejects.toThrow();
    } finally {
      await server.stop();
    }
  });

  it('ACL: the user reaches keys and channels under sluice: only, and no admin command', async () => {
    const server = await startAclRedis({ rule: fallbackAclRule, password: 'pw' });
    const user = new Redis(server.url, { maxRetriesPerRequest: 0 });
    try {
      expect(server.url).toBe(`redis://sluice:pw@127.0.0.1:${server.redis.port}`);
      expect(await user.call('ACL', 'WHOAMI')).toBe('sluice');
      await user.set('sluice:{pool-a}:lease', 'mine');
      expect(await user.get('sluice:{pool-a}:lease')).toBe('mine');
      expect(await user.publish('sluice:reply:r1', 'frame')).toBe(0);
      await expect(user.set('other:key', 'x')).rejects.toThrow(/NOPERM/);
      await expect(user.publish('other:channel', 'x')).rejects.toThrow(/NOPERM/);
      await expect(user.flushall()).rejects.toThrow(/NOPERM/);
      await expect(user.call('CONFIG', 'GET', 'maxmemory')).rejects.toThrow(/NOPERM/);
      // A script obeys the same key rules as a command (BullMQ runs all its work in scripts).
      await expect(user.eval("return redis.call('GET', KEYS[1])", 1, 'other:key')).rejects.toThrow(
        /NOPERM|No permissions/,
      );
      expect(await user.eval("return redis.call('GET', KEYS[1])", 1, 'sluice:{pool-a}:lease')).toBe(
        'mine',
      );
      // The wrong password is refused.
      await expect(
        askNode(server.redis.port, (r) => r.ping(), { username: 'sluice', password: 'nope' }),
      ).rejects.toThrow(/WRONGPASS/);
    } finally {
      user.disconnect();
      await server.stop();
    }
  });

  it('reads an ACL line with any password placeholder and sets the given password', () => {
    expect(aclArguments('ACL SETUSER app on >CHANGE-ME ~app:* +@read', 'pw')).toEqual({
      user: 'app',
      rules: ['on', '~app:*', '+@read', '>pw'],
    });
    expect(() => aclArguments('SET x y', 'pw')).toThrow(/not an ACL SETUSER line/);
  });
});
