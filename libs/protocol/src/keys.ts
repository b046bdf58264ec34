// Every Redis key and channel name Sluice uses, derived from one prefix. BullMQ's own keys
// live under `<prefix>:<queue name>:*`; on Redis Cluster the prefix is written `{sluice}`
// so that BullMQ's scripts and ours touch a single hash slot.

export interface KeySpace {
  /** BullMQ `prefix` option. */
  readonly prefix: string;
  /** BullMQ queue name of a pool. */
  queueName(pool: string): string;
  /** Lease held by the one dispatcher allowed to release this pool's jobs. */
  lease(pool: string): string;
  /** Sorted set of queue places reserved by gateways whose add is in progress. */
  admissions(pool: string): string;
  /** The dispatcher's published view of a pool (in-flight, drain rate) for gateways and `sluice status`. */
  poolStats(pool: string): string;
  /** What every `poolStats` key starts with, for listing them. */
  readonly poolStatsPrefix: string;
  /** Liveness key of a gateway replica, with a TTL. */
  replicaAlive(replica: string): string;
  /** Pub/sub channel carrying reply frames to one gateway replica. */
  replyChannel(replica: string): string;
  /** Pub/sub channel on which gateways ask the dispatcher to cancel a running job. */
  readonly cancelChannel: string;
}

const validPart = /^[A-Za-z0-9_.-]+$/;

function part(kind: string, value: string): string {
  if (!validPart.test(value))
    throw new Error(
      `${kind} ${JSON.stringify(value)} may only contain letters, digits, '_', '.', '-'`,
    );
  return value;
}

export function keySpace(prefix = 'sluice'): KeySpace {
  return {
    prefix,
    queueName: (pool) => `pool-${part('pool', pool)}`,
    lease: (pool) => `${prefix}:lease:${part('pool', pool)}`,
    admissions: (pool) => `${prefix}:admissions:${part('pool', pool)}`,
    poolStats: (pool) => `${prefix}:stats:${part('pool', pool)}`,
    poolStatsPrefix: `${prefix}:stats:`,
    replicaAlive: (replica) => `${prefix}:replica:${part('replica', replica)}`,
    replyChannel: (replica) => `${prefix}:reply:${part('replica', replica)}`,
    cancelChannel: `${prefix}:cancel`,
  };
}
