// Is Redis there, and did it take our credentials? Works for every topology: a Cluster
// emits `ready` once its slots are known, and reports a refused login inside the error
// that says no node could be reached.
import { redisAddress, type Redis } from './connect.js';

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

/**
 * True for the errors Redis answers to missing or wrong credentials, also when a Cluster
 * wraps the node's answer (`lastNodeError`) or Sentinel quotes it ("Last error: ...").
 */
export function isAuthError(err: unknown): boolean {
  if (!(err instanceof Error)) return false;
  const inner = (err as { lastNodeError?: unknown }).lastNodeError;
  return authFailure.test(err.message) || (inner !== err && isAuthError(inner));
}

/**
 * Resolves once the connection is ready. Rejects with a RedisAuthError at the first
 * authentication failure, and, when `timeoutMs` is given, with an error naming the address
 * once that has passed; without it, waits as long as Redis takes to appear.
 */
export function redisReady(redis: Redis, timeoutMs?: number): Promise<void> {
  if (redis.status === 'ready') return Promise.resolve();
  const address = redisAddress(redis);
  return new Promise((resolve, reject) => {
    let timer: NodeJS.Timeout | undefined;
    const done = () => {
      clearTimeout(timer);
      redis.off('ready', onReady);
      redis.off('error', onError);
      redis.off('node error', onError);
    };
    const onReady = () => {
      done();
      resolve();
    };
    const onError = (err: Error) => {
      if (!isAuthError(err)) return;
      done();
      const detail = (err as { lastNodeError?: Error }).lastNodeError?.message ?? err.message;
      reject(new RedisAuthError(`Redis at ${address} refused the credentials: ${detail}`));
    };
    if (timeoutMs !== undefined)
      timer = setTimeout(() => {
        done();
        reject(new Error(`Redis at ${address} not reachable within ${timeoutMs} ms`));
      }, timeoutMs);
    redis.once('ready', onReady);
    redis.on('error', onError);
    // A Cluster reports each node's refusal here first.
    redis.on('node error', onError);
  });
}
