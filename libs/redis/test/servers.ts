// The smallest real topologies a unit test needs, from redis-server itself: a one-node
// Cluster holding every slot, and one sentinel watching a single-node master. The full
// topologies (replicas, three masters, failover) are the e2e harness's.
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { eventually, freePort, startProcess, type StartedProcess } from '@sluice/test/support';
import { Redis } from 'ioredis';

const server = process.env['REDIS_SERVER_BIN'] ?? 'redis-server';

export interface TestNode {
  readonly port: number;
  readonly process: StartedProcess;
  stop(): Promise<void>;
}

/** Stops the server, then removes its directory: it writes there until it has exited. */
const stopAndRemove = (proc: StartedProcess, dir: string) => async () => {
  await proc.stop();
  await rm(dir, { recursive: true, force: true });
};

/** The server's start, its directory removed when it never started. */
const startIn = (dir: string, options: Parameters<typeof startProcess>[0]) =>
  startProcess(options).catch(async (err: unknown) => {
    await rm(dir, { recursive: true, force: true });
    throw err;
  });

export async function startOneNodeCluster(password?: string): Promise<TestNode> {
  const dir = await mkdtemp(join(tmpdir(), 'sluice-cluster-'));
  const port = await freePort();
  const args = ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--dir', dir];
  args.push('--cluster-enabled', 'yes', '--cluster-config-file', join(dir, 'nodes.conf'));
  // Alone, a node does not know its own address and CLUSTER SLOTS would name none.
  args.push('--cluster-announce-ip', '127.0.0.1');
  if (password) args.push('--requirepass', password);
  const proc = await startIn(dir, { command: server, args, ready: /Ready to accept connections/ });
  const stop = stopAndRemove(proc, dir);
  const admin = new Redis({ port, host: '127.0.0.1', password, lazyConnect: true });
  try {
    await admin.call('CLUSTER', 'ADDSLOTSRANGE', '0', '16383');
    await eventually(
      async () => String(await admin.call('CLUSTER', 'INFO')).includes('cluster_state:ok'),
      'the one-node cluster to serve every slot',
    );
  } catch (err) {
    // The caller gets no node to stop: a server that never served would outlive the test.
    await stop();
    throw err;
  } finally {
    admin.disconnect();
  }
  return { port, process: proc, stop };
}

export async function startSentinel(masterName: string, masterPort: number): Promise<TestNode> {
  const dir = await mkdtemp(join(tmpdir(), 'sluice-sentinel-'));
  const port = await freePort();
  const config = join(dir, 'sentinel.conf');
  // Sentinel rewrites its config file, so it must be a file of its own.
  await writeFile(
    config,
    `port ${port}\nbind 127.0.0.1\ndir ${dir}\nsentinel monitor ${masterName} 127.0.0.1 ${masterPort} 1\n`,
  );
  const proc = await startIn(dir, {
    command: server,
    args: [config, '--sentinel'],
    ready: new RegExp(`\\+monitor master ${masterName}`),
  });
  return { port, process: proc, stop: stopAndRemove(proc, dir) };
}
