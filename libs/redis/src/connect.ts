// One place that knows how Sluice talks to Redis: which ioredis options each role needs.
import { Redis, type RedisOptions } from 'ioredis';

export type RedisRole =
  /** Commands on the request path: fail fast when Redis is away instead of queueing forever. */
  | 'command'
  /** Pub/sub subscriber: reconnects forever, resubscribes by itself. */
  | 'subscriber'
  /** Handed to BullMQ Queue/Worker: BullMQ requires maxRetriesPerRequest null. */
  | 'bullmq';

/**
 * The longest a command on the request path waits for Redis. A stopped or partitioned Redis
 * keeps the socket open and answers nothing; without a bound, every caller would hang with it.
 * A healthy Redis answers these small commands in well under a millisecond.
 */
export const COMMAND_TIMEOUT_MS = 1000;

const roleOptions: Record<RedisRole, RedisOptions> = {
  command: {
    maxRetriesPerRequest: 1,
    enableAutoPipelining: true,
    commandTimeout: COMMAND_TIMEOUT_MS,
  },
  subscriber: { maxRetriesPerRequest: null },
  bullmq: { maxRetriesPerRequest: null, enableReadyCheck: true },
};

export interface RedisConnectOptions {
  /** Shown by CLIENT LIST: `sluice:<component>:<id>:<role>`. */
  name: string;
  role: RedisRole;
}

export function createRedis(url: string, { name, role }: RedisConnectOptions): Redis {
  return new Redis(url, {
    connectionName: name,
    // Back off up to 1 s between reconnects, so service resumes within about a second of
    // Redis coming back; never give up: Redis restarts are routine.
    retryStrategy: (attempt) => Math.min(50 * 2 ** attempt, 1000),
    ...roleOptions[role],
  });
}

/** True when Redis answers PING within `timeoutMs`. */
export async function redisHealthy(redis: Redis, timeoutMs = 500): Promise<boolean> {
  if (redis.status !== 'ready') return false;
  let timer: NodeJS.Timeout | undefined;
  try {
    const pong = await Promise.race([
      redis.ping(),
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error('timeout')), timeoutMs);
      }),
    ]);
    return pong === 'PONG';
  } catch {
    return false;
  } finally {
    clearTimeout(timer);
  }
}

/** Redis refused our credentials: retrying will not help, so it is fatal, said as such. */
export class RedisAuthError extends Error {
  readonly code = 'ERR_SLUICE_REDIS_AUTH';
}

const authFailure = /WRONGPASS|NOAUTH|invalid password|invalid username-password|NOPERM/i;

/** True for the errors Redis answers to missing or wrong credentials. */
export function isAuthError(err: unknown): boolean {
  return err instanceof Error && authFailure.test(err.message);
}

/**
 * Resolves once the connection is ready. Rejects with a RedisAuthError at the first
 * authentication failure, and, when `timeoutMs` is given, with an error naming the address
 * once that has passed; without it, waits as long as Redis takes to appear.
 */
export function redisReady(redis: Redis, timeoutMs?: number): Promise<void> {
  if (redis.status === 'ready') return Promise.resolve();
  const address = `${redis.options.host}:${redis.options.port}`;
  return new Promise((resolve, reject) => {
    let timer: NodeJS.Timeout | undefined;
    const done = () => {
      clearTimeout(timer);
      redis.off('ready', onReady);
      redis.off('error', onError);
    };
    const onReady = () => {
      done();
      resolve();
    };
    const onError = (err: Error) => {
      if (!isAuthError(err)) return;
      done();
      reject(new RedisAuthError(`Redis at ${address} refused the credentials: ${err.message}`));
    };
    if (timeoutMs !== undefined)
      timer = setTimeout(() => {
        done();
        reject(new Error(`Redis at ${address} not reachable within ${timeoutMs} ms`));
      }, timeoutMs);
    redis.once('ready', onReady);
    redis.on('error', onError);
  });
}
