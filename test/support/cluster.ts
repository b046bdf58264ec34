// A real Redis Cluster on loopback ports: N masters (3 by default) that split the 16384 slots
// in even ranges, joined with CLUSTER commands so only redis-server is needed (no redis-cli).
// Ready once every node says `cluster_state:ok` and knows every other node.
import { createServer } from 'node:net';
import { join } from 'node:path';
import { Cluster, Redis } from 'ioredis';
import { eventually } from './engine-sim.ts';
import { freePort } from './ports.ts';
import { startRedisNode, stopAll, tempDir, type RedisNode } from './redis-node.ts';

export interface TestClusterOptions {
  /** Masters (default 3); no replicas. */
  masters?: number;
  /** `requirepass` of every node. */
  password?: string;
  /** A replica for each master (default none): a failover test stops a master. */
  replicas?: boolean;
}

export interface SlotRange {
  readonly port: number;
  readonly from: number;
  readonly to: number;
}

export interface TestCluster {
  /** The environment that points Sluice at this cluster. */
  readonly env: Record<string, string>;
  readonly nodes: RedisNode[];
  /** With `replicas`: the replica of each master, in the order of `nodes`. */
  readonly replicas: RedisNode[];
  /** Which node serves which slots: fixed at start, nothing moves them. */
  readonly slots: SlotRange[];
  /** `CLUSTER KEYSLOT key`, asked of the cluster itself. */
  keySlot(key: string): Promise<number>;
  /** The port of the master that serves `key`. */
  nodeOf(key: string): Promise<number>;
  /** A cluster client (the caller closes it). */
  client(): Cluster;
  stop(): Promise<void>;
}

const SLOTS = 16384;
/** The cluster bus listens on the client port + 10000 (the only choice before Redis 7). */
const BUS_OFFSET = 10_000;

function isFree(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const server = createServer();
    server.unref();
    server.once('error', () => resolve(false));
    server.listen(port, '127.0.0.1', () => server.close(() => resolve(true)));
  });
}

/** A free port whose bus port is free too. */
async function freeNodePort(): Promise<number> {
  for (;;) {
    const port = await freePort();
    if (port + BUS_OFFSET <= 65_535 && (await isFree(port + BUS_OFFSET))) return port;
  }
}

export async function startCluster(options: TestClusterOptions = {}): Promise<TestCluster> {
  const masters = options.masters ?? 3;
  const { password } = options;
  const dir = await tempDir('cluster');
  const started: { stop(): Promise<void> }[] = [{ stop: () => dir.remove() }];
  try {
    const startNode = () =>
      startRedisNode({
        port: freeNodePort,
        args: (port) => [
          '--port',
          String(port),
          '--bind',
          '127.0.0.1',
          '--dir',
          dir.path,
          '--save',
          '',
          '--appendonly',
          'no',
          '--cluster-enabled',
          'yes',
          '--cluster-config-file',
          join(dir.path, `nodes-${port}.conf`),
          '--cluster-node-timeout',
          '5000',
          ...(password ? ['--requirepass', password, '--masterauth', password] : []),
        ],
      });
    const nodes = await Promise.all(Array.from({ length: masters }, startNode));
    started.push(...nodes);
    const slots = nodes.map((node, i) => ({
      port: node.port,
      from: Math.floor((i * SLOTS) / masters),
      to: Math.floor(((i + 1) * SLOTS) / masters) - 1,
    }));

    const admins = nodes.map(
      (node) =>
        new Redis({
          host: '127.0.0.1',
          port: node.port,
          maxRetriesPerRequest: 1,
          ...(password ? { password } : {}),
        }),
    );
    try {
      // Distinct config epochs before the nodes meet, as redis-cli does: no epoch collision
      // to resolve, so the slot map settles at once.
      await Promise.all(admins.map((a, i) => a.call('CLUSTER', 'SET-CONFIG-EPOCH', String(i + 1))));
      for (const node of nodes.slice(1))
        await admins[0]!.call('CLUSTER', 'MEET', '127.0.0.1', String(node.port));
      await Promise.all(
        admins.map((a, i) => {
          const { from, to } = slots[i]!;
          const list = Array.from({ length: to - from + 1 }, (_, k) => String(from + k));
          return a.call('CLUSTER', 'ADDSLOTS', ...list);
        }),
      );
      await eventually(
        async () => {
          for (const admin of admins) {
            const text = String(await admin.call('CLUSTER', 'INFO'));
            if (!/^cluster_state:ok\r?$/m.test(text)) return undefined;
            if (!new RegExp(`^cluster_known_nodes:${masters}\\r?$`, 'm').test(text))
              return undefined;
          }
          return true;
        },
        'every cluster node to say cluster_state:ok and know every other node',
        60_000,
      );
    } finally {
      admins.forEach((a) => a.disconnect());
    }
    const replicas = options.replicas ? await addReplicas(nodes, startNode, password) : [];
    started.push(...replicas);

    const client = () => {
      const cluster = new Cluster(
        nodes.map((n) => ({ host: '127.0.0.1', port: n.port })),
        password ? { redisOptions: { password } } : {},
      );
      // Node faults make it reconnect; its errors are expected, and the caller's commands say them.
      cluster.on('error', () => {});
      return cluster;
    };
    async function keySlot(key: string): Promise<number> {
      const cluster = client();
      try {
        return Number(await cluster.call('CLUSTER', 'KEYSLOT', key));
      } finally {
        cluster.disconnect();
      }
    }
    return {
      env: {
        REDIS_CLUSTER_NODES: nodes.map((n) => `127.0.0.1:${n.port}`).join(','),
        ...(password ? { REDIS_PASSWORD: password } : {}),
      },
      nodes,
      replicas,
      slots,
      keySlot,
      async nodeOf(key) {
        const slot = await keySlot(key);
        return slots.find((r) => r.from <= slot && slot <= r.to)!.port;
      },
      client,
      stop: () => stopAll(started),
    };
  } catch (err) {
    await stopAll(started).catch(() => {});
    throw err;
  }
}

/**
 * One replica per master, each told to replicate its master (CLUSTER REPLICATE), ready once
 * every replica's link to its master is up and every node lists every replica in its slot map.
 */
async function addReplicas(
  masters: RedisNode[],
  startNode: () => Promise<RedisNode>,
  password: string | undefined,
): Promise<RedisNode[]> {
  const replicas = await Promise.all(masters.map(() => startNode()));
  const admin = (node: RedisNode) =>
    new Redis({
      host: '127.0.0.1',
      port: node.port,
      maxRetriesPerRequest: 1,
      ...(password ? { password } : {}),
    });
  const admins = replicas.map(admin);
  const masterAdmins = masters.map(admin);
  try {
    const ids = await Promise.all(masterAdmins.map((a) => a.call('CLUSTER', 'MYID')));
    for (const a of admins) await a.call('CLUSTER', 'MEET', '127.0.0.1', String(masters[0]!.port));
    const nodeCount = masters.length + replicas.length;
    await eventually(
      async () => {
        for (const a of [...admins, ...masterAdmins]) {
          const text = String(await a.call('CLUSTER', 'INFO'));
          if (!new RegExp(`^cluster_known_nodes:${nodeCount}\\r?$`, 'm').test(text))
            return undefined;
        }
        return true;
      },
      'every cluster node to know every replica',
      60_000,
    );
    await Promise.all(admins.map((a, i) => a.call('CLUSTER', 'REPLICATE', String(ids[i]))));
    await eventually(
      async () => {
        for (const a of admins)
          if (!/^master_link_status:up\r?$/m.test(String(await a.call('INFO', 'replication'))))
            return undefined;
        return true;
      },
      "every replica's link to its master",
      60_000,
    );
    // CLUSTER SLOTS leaves out a replica whose replication offset the answering node knows as
    // 0 (isReplicaAvailable, redis src/cluster.c), and a node learns the offset from the
    // replica's own gossip, a second or more after the link is up. Until every node has it,
    // clients that read the slot map (ioredis every second) find a replica listed by one node
    // and gone at the next: ioredis drops it from its pool, and moves a subscriber sitting on
    // it, with the replica in perfect health. Seen: a replica just stopped under the gateway's
    // subscriber left ioredis's pool within a second (a node that still knew its offset as 0
    // answered the slot read), and ioredis moved the subscriber off it before the gateway
    // could find it deaf.
    await eventually(
      async () => {
        for (const a of [...admins, ...masterAdmins]) {
          const slots = (await a.call('CLUSTER', 'SLOTS')) as unknown[][];
          // Each range: its first and last slot, its master, then its replicas.
          const listed = slots.reduce((n, range) => n + range.length - 2, 0);
          if (listed !== nodeCount) return undefined;
        }
        return true;
      },
      'every cluster node to list every replica in CLUSTER SLOTS',
      60_000,
    );
    return replicas;
  } catch (err) {
    await Promise.all(replicas.map((r) => r.stop().catch(() => {})));
    throw err;
  } finally {
    [...admins, ...masterAdmins].forEach((a) => a.disconnect());
  }
}
