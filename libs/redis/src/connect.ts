// One place that knows how Sluice talks to Redis: which ioredis options each role needs.
import { Redis, type RedisOptions } from 'ioredis';

export type RedisRole =
  /** Commands on the request path: fail fast when Redis is away instead of queueing forever. */
  | 'command'
  /** Pub/sub subscriber: reconnects forever, resubscribes by itself. */
  | 'subscriber'
  /** Handed to BullMQ Queue/Worker: BullMQ requires maxRetriesPerRequest null. */
  | 'bullmq';

const roleOptions: Record<RedisRole, RedisOptions> = {
  command: { maxRetriesPerRequest: 1, enableAutoPipelining: true },
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
    // Back off up to 2 s between reconnects; never give up: Redis restarts are routine.
    retryStrategy: (attempt) => Math.min(50 * 2 ** attempt, 2000),
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

/** Resolves once the connection is ready, or rejects after `timeoutMs` naming the URL. */
export function redisReady(redis: Redis, timeoutMs = 10_000): Promise<void> {
  if (redis.status === 'ready') return Promise.resolve();
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      redis.off('ready', onReady);
      reject(
        new Error(
          `Redis at ${redis.options.host}:${redis.options.port} not reachable within ${timeoutMs} ms`,
        ),
      );
    }, timeoutMs);
    const onReady = () => {
      clearTimeout(timer);
      resolve();
    };
    redis.once('ready', onReady);
  });
}
