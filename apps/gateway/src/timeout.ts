// A bound on calls that have none of their own: BullMQ's connection waits for Redis forever
// (BullMQ requires it), but a held client must not wait with it.
import { COMMAND_TIMEOUT_MS } from '@sluice/redis';

export class RedisTimeoutError extends Error {
  readonly code = 'ERR_SLUICE_REDIS_TIMEOUT';
}

/** Rejects after `ms` (the command connection's timeout by default); a late rejection is dropped. */
export function withTimeout<T>(
  promise: Promise<T>,
  what: string,
  ms = COMMAND_TIMEOUT_MS,
): Promise<T> {
  promise.catch(() => {});
  let timer: NodeJS.Timeout | undefined;
  const expired = new Promise<never>((_, reject) => {
    timer = setTimeout(
      () => reject(new RedisTimeoutError(`${what}: no answer within ${ms} ms`)),
      ms,
    );
  });
  return Promise.race([promise, expired]).finally(() => clearTimeout(timer));
}
