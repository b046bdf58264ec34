// One redis-server process of a topology (a master, a replica, a sentinel, a cluster node) on a
// free loopback port, ready when it says so. A port another process takes between freePort()
// and bind costs a retry on a new one.
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { ConnectionOptions } from 'node:tls';
import { Redis } from 'ioredis';
import { startProcess, type StartedProcess } from './process.ts';
import { freePort } from './ports.ts';

export interface RedisNode {
  readonly port: number;
  readonly process: StartedProcess;
  stop(signal?: NodeJS.Signals): Promise<void>;
}

export interface RedisNodeOptions {
  /** The arguments for a port (the port's own flags included). */
  args: (port: number) => string[];
  /** What the server prints once it serves (default: a data node's line). */
  ready?: RegExp;
  /** Picks the port to try (default: any free one). */
  port?: () => Promise<number>;
}

export const redisServerBin = (): string => process.env['REDIS_SERVER_BIN'] ?? 'redis-server';

export async function startRedisNode(options: RedisNodeOptions): Promise<RedisNode> {
  for (let attempt = 1; ; attempt += 1) {
    const port = await (options.port ?? freePort)();
    try {
      const proc = await startProcess({
        command: redisServerBin(),
        args: options.args(port),
        ready: options.ready ?? /Ready to accept connections/,
      });
      return { port, process: proc, stop: (signal) => proc.stop(signal) };
    } catch (err) {
      if (attempt >= 3) throw err;
    }
  }
}

/** A temporary directory for a topology's config and data files, and its removal. */
export async function tempDir(name: string): Promise<{ path: string; remove(): Promise<void> }> {
  const path = await mkdtemp(join(tmpdir(), `sluice-${name}-`));
  return { path, remove: () => rm(path, { recursive: true, force: true }) };
}

/** Stops every started part, newest first, even when one of them fails to stop. */
export async function stopAll(parts: { stop(): Promise<void> }[]): Promise<void> {
  const errors: unknown[] = [];
  for (const part of parts.splice(0).reverse()) await part.stop().catch((e) => errors.push(e));
  if (errors.length > 0) throw errors[0];
}

export interface AskOptions {
  username?: string;
  password?: string;
  tls?: ConnectionOptions;
}

/**
 * Runs `ask` on a fresh connection to one server and closes it: for set-up and for polling a
 * node that may be down (a refused connection rejects at once instead of queueing commands).
 */
export async function askNode<T>(
  port: number,
  ask: (redis: Redis) => Promise<T>,
  options: AskOptions = {},
): Promise<T> {
  const redis = new Redis({
    host: '127.0.0.1',
    port,
    lazyConnect: true,
    retryStrategy: () => null,
    maxRetriesPerRequest: 0,
    ...options,
  });
  // ioredis rejects `connect` with "Connection is closed." and emits the cause (a TLS or
  // AUTH failure) as an event: reject with the cause.
  let cause: Error | undefined;
  redis.on('error', (err: Error) => (cause = err));
  try {
    await redis.connect().catch((err: unknown) => {
      throw cause ?? err;
    });
    return await ask(redis);
  } finally {
    redis.disconnect();
  }
}

/** `INFO <section>` as a map of its fields. */
export async function info(redis: Redis, section: string): Promise<Record<string, string>> {
  const text = await redis.info(section);
  return Object.fromEntries(
    text
      .split('\r\n')
      .filter((line) => line.includes(':'))
      .map((line) => [line.slice(0, line.indexOf(':')), line.slice(line.indexOf(':') + 1)]),
  );
}
