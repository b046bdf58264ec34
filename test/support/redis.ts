// A real redis-server on a loopback port, stopped by the caller. No persistence unless asked:
// fault tests restart it on the same port, empty or from its append-only file.
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startProcess, type StartedProcess } from './process.ts';
import { freePort } from './ports.ts';

export interface TestRedis {
  readonly url: string;
  readonly port: number;
  readonly process: StartedProcess;
  stop(): Promise<void>;
}

export interface TestRedisOptions {
  /** A fixed port (a restart of an earlier server); a free one when absent. */
  port?: number;
  /** `requirepass`: clients must send it. */
  password?: string;
  /**
   * Keep an append-only file in this directory, so a restart keeps the data (the caller removes
   * it); when `true`, in one made for this server alone, which `stop()` removes.
   */
  appendonly?: string | true;
}

export async function startRedis(options: TestRedisOptions = {}): Promise<TestRedis> {
  const command = process.env['REDIS_SERVER_BIN'] ?? 'redis-server';
  // Only a directory made here is removed here: a given one outlives this server for the restart.
  const ownDir =
    options.appendonly === true ? await mkdtemp(join(tmpdir(), 'sluice-redis-')) : undefined;
  const dir = options.appendonly === true ? ownDir : options.appendonly;
  const removeOwnDir = async () => {
    if (ownDir) await rm(ownDir, { recursive: true, force: true });
  };
  for (let attempt = 1; ; attempt += 1) {
    const port = options.port ?? (await freePort());
    // Redis drops a subscriber whose output buffer passes 32 MB (8 MB for 60 s) by default:
    // a gateway starved of CPU on a crowded test host, under the slow-client tests' firehose
    // of frames, would lose its reply connection instead of backing up its client's socket.
    const args = ['--port', String(port), '--bind', '127.0.0.1', '--save', ''];
    args.push('--client-output-buffer-limit', 'pubsub 512mb 256mb 60');
    args.push(...(dir ? ['--appendonly', 'yes', '--dir', dir] : ['--appendonly', 'no']));
    if (options.password) args.push('--requirepass', options.password);
    try {
      const proc = await startProcess({ command, args, ready: /Ready to accept connections/ });
      const auth = options.password ? `:${options.password}@` : '';
      return {
        url: `redis://${auth}127.0.0.1:${port}`,
        port,
        process: proc,
        stop: async () => {
          await proc.stop();
          await removeOwnDir();
        },
      };
    } catch (err) {
      // Another process may take the port between freePort() and bind; try a new one.
      if (options.port !== undefined || attempt >= 3) {
        await removeOwnDir();
        throw err;
      }
    }
  }
}
