// A real Sentinel deployment on loopback ports: a master, a replica of it, and three sentinels
// (quorum 2) that promote the replica about a second after the master stops answering. It is
// ready once the replica has synced and every sentinel knows the replica and the two others,
// so a failover can be voted the moment a test kills the master.
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { eventually } from './engine-sim.ts';
import { askNode, startRedisNode, stopAll, tempDir, type RedisNode } from './redis-node.ts';

export interface TestSentinelOptions {
  /** The name the sentinels monitor (default `sluice`). */
  masterName?: string;
  /** `requirepass` of the data nodes (the replica and the sentinels use it too). */
  password?: string;
  /** `requirepass` of the sentinels themselves. */
  sentinelPassword?: string;
  /** How long the master may be silent before a sentinel thinks it down (default 1000 ms). */
  downAfterMs?: number;
}

export interface TestSentinel {
  /** The environment that points Sluice at this deployment. */
  readonly env: Record<string, string>;
  readonly masterName: string;
  /** The data node that is master at start, and its replica. */
  readonly master: RedisNode;
  readonly replica: RedisNode;
  readonly sentinels: RedisNode[];
  /** The port of the data node every sentinel names as master now. */
  masterPort(): Promise<number>;
  /**
   * Resolves with the new master's port once every sentinel names a master other than `from`
   * and that node says it is one. Polls: it waits for the failover, not for a time.
   */
  waitForFailover(from: number, timeoutMs?: number): Promise<number>;
  /** A client that finds the master through the sentinels (the caller closes it). */
  client(): Redis;
  stop(): Promise<void>;
}

const DEFAULTS = { masterName: 'sluice', downAfterMs: 1000 };

export async function startSentinel(options: TestSentinelOptions = {}): Promise<TestSentinel> {
  const { masterName, downAfterMs } = { ...DEFAULTS, ...options };
  const { password, sentinelPassword } = options;
  const dir = await tempDir('sentinel');
  const started: { stop(): Promise<void> }[] = [{ stop: () => dir.remove() }];
  const dataAuth = password ? ['--requirepass', password, '--masterauth', password] : [];
  const dataNode = (extra: string[]) =>
    startRedisNode({
      args: (port) => [
        '--port',
        String(port),
        '--bind',
        '127.0.0.1',
        // A replica writes the snapshot it receives: into the deployment's own directory,
        // one file per node, never into the working directory of the test.
        '--dir',
        dir.path,
        '--dbfilename',
        `dump-${port}.rdb`,
        '--save',
        '',
        '--appendonly',
        'no',
        // The master sends its first snapshot at once instead of waiting 5 s for more replicas.
        '--repl-diskless-sync-delay',
        '0',
        ...dataAuth,
        ...extra,
      ],
    });
  try {
    const master = await dataNode([]);
    started.push(master);
    const replica = await dataNode(['--replicaof', '127.0.0.1', String(master.port)]);
    started.push(replica);
    await replica.process.waitForLine(/MASTER <-> REPLICA sync: Finished with success/);

    const sentinels: RedisNode[] = [];
    for (let i = 0; i < 3; i += 1) {
      const sentinel = await startRedisNode({
        // Sentinel rewrites its config file as it learns: each one needs its own, writable.
        args: (port) => {
          const file = join(dir.path, `sentinel-${i}-${port}.conf`);
          writeFileSync(file, sentinelConfig(port, master.port));
          return [file, '--sentinel'];
        },
        ready: new RegExp(`\\+monitor master ${masterName} `),
      });
      sentinels.push(sentinel);
      started.push(sentinel);
    }

    function sentinelConfig(port: number, masterPort: number): string {
      return [
        `port ${port}`,
        'bind 127.0.0.1',
        `dir ${dir.path}`,
        ...(sentinelPassword
          ? [`requirepass ${sentinelPassword}`, `sentinel sentinel-pass ${sentinelPassword}`]
          : []),
        `sentinel monitor ${masterName} 127.0.0.1 ${masterPort} 2`,
        `sentinel down-after-milliseconds ${masterName} ${downAfterMs}`,
        // Also the wait before a failed vote is retried (twice this): short, for tests.
        `sentinel failover-timeout ${masterName} 3000`,
        ...(password ? [`sentinel auth-pass ${masterName} ${password}`] : []),
        '',
      ].join('\n');
    }

    // One connection to each sentinel for the deployment's life: polling them is cheap.
    const watchers = sentinels.map(
      (node) =>
        new Redis({
          host: '127.0.0.1',
          port: node.port,
          maxRetriesPerRequest: 1,
          ...(sentinelPassword ? { password: sentinelPassword } : {}),
        }),
    );
    started.push({ stop: async () => watchers.forEach((w) => w.disconnect()) });
    const sentinelCall = (node: RedisNode, ...args: string[]) =>
      watchers[sentinels.indexOf(node)]!.call('SENTINEL', ...args);

    // Sentinels find each other through hello messages on the master, every 2 s: a vote
    // needs them to know each other, and a promotion needs them to know the replica.
    await eventually(
      async () => {
        for (const node of sentinels) {
          const peers = (await sentinelCall(node, 'sentinels', masterName)) as unknown[];
          const replicas = (await sentinelCall(node, 'replicas', masterName)) as string[][];
          const healthy = replicas.filter((fields) => {
            const flags = fields[fields.indexOf('flags') + 1] ?? '';
            return flags === 'slave';
          });
          if (peers.length !== 2 || healthy.length !== 1) return undefined;
        }
        return true;
      },
      'every sentinel to know the replica and the two other sentinels',
      60_000,
    );

    async function masterPorts(): Promise<number[]> {
      return Promise.all(
        sentinels.map(async (node) => {
          const addr = (await sentinelCall(node, 'get-master-addr-by-name', masterName)) as [
            string,
            string,
          ];
          return Number(addr[1]);
        }),
      );
    }

    const env: Record<string, string> = {
      REDIS_SENTINELS: sentinels.map((s) => `127.0.0.1:${s.port}`).join(','),
      REDIS_SENTINEL_MASTER: masterName,
      ...(password ? { REDIS_PASSWORD: password } : {}),
      ...(sentinelPassword ? { REDIS_SENTINEL_PASSWORD: sentinelPassword } : {}),
    };

    return {
      env,
      masterName,
      master,
      replica,
      sentinels,
      async masterPort() {
        const ports = await masterPorts();
        if (new Set(ports).size !== 1)
          throw new Error(`the sentinels disagree on the master: ${ports.join(', ')}`);
        return ports[0]!;
      },
      waitForFailover(from, timeoutMs = 60_000) {
        return eventually(
          async () => {
            const ports = await masterPorts().catch(() => []);
            const next = ports[0];
            if (next === undefined || next === from || ports.some((p) => p !== next))
              return undefined;
            const role = await askNode(
              next,
              (r) => r.call('ROLE') as Promise<string[]>,
              password ? { password } : {},
            ).catch(() => undefined);
            return role?.[0] === 'master' ? next : undefined;
          },
          `the sentinels to promote a master other than 127.0.0.1:${from}`,
          timeoutMs,
        );
      },
      client: () => {
        const client = new Redis({
          sentinels: sentinels.map((s) => ({ host: '127.0.0.1', port: s.port })),
          name: masterName,
          ...(password ? { password } : {}),
          ...(sentinelPassword ? { sentinelPassword } : {}),
        });
        // A failover makes it reconnect; its errors are expected, and the caller's commands say them.
        client.on('error', () => {});
        return client;
      },
      stop: () => stopAll(started),
    };
  } catch (err) {
    await stopAll(started).catch(() => {});
    throw err;
  }
}
