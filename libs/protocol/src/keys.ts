// Every Redis key and channel name Sluice uses, derived from one prefix (docs/redis.md).
//
// On Redis Cluster a multi-key command or script must touch one hash slot. So every key of a
// pool carries the pool's hash tag: BullMQ's queue is named `{pool-<name>}`, its keys are
// `<prefix>:{pool-<name>}:wait` etc., and Sluice's own per-pool keys sit beside them
// (`<prefix>:{pool-<name>}:lease`). Replica liveness keys share the `{replicas}` tag, so one
// pipeline checks them all. Different pools may land on different nodes. A single node
// ignores the tags, so every topology uses the same layout. Channels are not keys.

export interface KeySpace {
  /** BullMQ `prefix` option. */
  readonly prefix: string;
  /** BullMQ queue name of a pool: the pool's hash tag, `{pool-<name>}`. */
  queueName(pool: string): string;
  /** A BullMQ key of the pool's queue: `wait`, `prioritized`, `delayed`, ... */
  queueKey(pool: string, type: string): string;
  /** The hash BullMQ keeps a job in: it exists from the add until the job is removed. */
  jobKey(pool: string, jobId: string): string;
  /**
   * A large request body, raw, beside its job (`bodyInKey`): written by the admission script,
   * read and deleted (GETDEL) by the dispatcher that runs the job, and set to expire after the
   * job's park limit, so a job that never runs leaves nothing behind for long.
   */
  jobBody(pool: string, jobId: string): string;
  /** Lease held by the one dispatcher allowed to release this pool's jobs. */
  lease(pool: string): string;
  /**
   * Sorted set of one tenant's queued (not yet released) jobs in a pool, held ones included:
   * score the job's BullMQ priority, member the job id (time-ordered, so equal scores are
   * FIFO). The gateway adds in the admission script; whoever ends the job's wait removes.
   */
  tenantQueued(pool: string, tenant: string): string;
  /** Hash of the pool's fair-share counters (tenant -> virtual tokens), kept by the leader. */
  fairShare(pool: string): string;
  /** The operator's mode of a pool (`sluice pool pause|resume|drain`): absent means open. */
  poolControl(pool: string): string;
  /** The dispatcher's published view of a pool (in-flight, drain rate) for gateways and `sluice status`. */
  poolStats(pool: string): string;
  /** A SCAN pattern matching every `poolStats` key. */
  readonly poolStatsPattern: string;
  /** The pool a `poolStats` key belongs to; undefined for any other key. */
  poolOfStatsKey(key: string): string | undefined;
  /** Liveness key of a gateway replica, with a TTL. */
  replicaAlive(replica: string): string;
  /** Pub/sub channel carrying reply frames to one gateway replica. */
  replyChannel(replica: string): string;
  /**
   * Pub/sub channel on which a gateway replica hears its own heartbeat: published through its
   * command connection, subscribed on the same connection as its reply channel, so a
   * subscriber that stays connected and delivers nothing shows (reply-heartbeat.ts).
   */
  replyHeartbeatChannel(replica: string): string;
  /** Pub/sub channel on which gateways ask the dispatcher to cancel a running job. */
  readonly cancelChannel: string;
  /**
   * Pub/sub channel on which `sluice pool` names a pool whose `poolControl` key it changed:
   * a nudge to re-read the key now (the key is the truth; the leader also re-reads it each
   * stats tick, so a lost message costs at most a second).
   */
  readonly controlChannel: string;
}

const validPart = /^[A-Za-z0-9_.-]+$/;

/** The characters a name inside a key or channel (a pool, a tenant, a replica) may have. */
export const keyPartRule = "letters, digits, '_', '.', '-'";

/**
 * Whether `value` may name a pool, a tenant or a replica inside a key or channel. A payload
 * that names its replica is checked with it too (job.ts): a name the key space refuses would
 * otherwise throw wherever the dispatcher builds the reply channel.
 */
export function isKeyPart(value: string): boolean {
  return validPart.test(value);
}

function part(kind: string, value: string): string {
  if (!isKeyPart(value))
    throw new Error(`${kind} ${JSON.stringify(value)} may only contain ${keyPartRule}`);
  return value;
}

export function keySpace(prefix = 'sluice'): KeySpace {
  const queueName = (pool: string) => `{pool-${part('pool', pool)}}`;
  const queueKey = (pool: string, type: string) => `${prefix}:${queueName(pool)}:${type}`;
  const statsHead = `${prefix}:{pool-`;
  const statsTail = '}:stats';
  return {
    prefix,
    queueName,
    queueKey,
    jobKey: (pool, jobId) => queueKey(pool, jobId),
    jobBody: (pool, jobId) => queueKey(pool, `${jobId}:sluice-body`),
    lease: (pool) => queueKey(pool, 'lease'),
    poolStats: (pool) => queueKey(pool, 'stats'),
    poolControl: (pool) => queueKey(pool, 'control'),
    tenantQueued: (pool, tenant) => queueKey(pool, `tenant:${part('tenant', tenant)}`),
    fairShare: (pool) => queueKey(pool, 'fair-share'),
    poolStatsPattern: `${statsHead}*${statsTail}`,
    poolOfStatsKey(key) {
      if (!key.startsWith(statsHead) || !key.endsWith(statsTail)) return undefined;
      const pool = key.slice(statsHead.length, key.length - statsTail.length);
      return isKeyPart(pool) ? pool : undefined;
    },
    replicaAlive: (replica) => `${prefix}:{replicas}:${part('replica', replica)}`,
    replyChannel: (replica) => `${prefix}:reply:${part('replica', replica)}`,
    replyHeartbeatChannel: (replica) => `${prefix}:reply-heartbeat:${part('replica', replica)}`,
    cancelChannel: `${prefix}:cancel`,
    controlChannel: `${prefix}:control`,
  };
}
