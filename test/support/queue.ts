// What a pool has queued, read from Redis the way the gateway's depth bound counts it
// (BullMQ's plain wait list, its prioritised set, and the delayed set where the leader holds
// back what may not go yet), with names from @sluice/protocol.
import { keySpace } from '@sluice/protocol';
import type { Cluster, Redis } from 'ioredis';

export async function queuedJobs(
  redis: Redis | Cluster,
  prefix = 'sluice',
  pool = 'default',
): Promise<number> {
  const keys = keySpace(prefix);
  const queue = `${keys.prefix}:${keys.queueName(pool)}`;
  const [wait, prioritized, held] = await Promise.all([
    redis.llen(`${queue}:wait`),
    redis.zcard(`${queue}:prioritized`),
    redis.zcard(`${queue}:delayed`),
  ]);
  return wait + prioritized + held;
}
