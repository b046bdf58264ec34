// The gateway's side of one pool: adding jobs, the depth bound, leader presence and the
// Retry-After estimate. Leader presence and pool stats are read at most once a second per
// pool, not per request (a hand-over's first miss: see hasLeader).
import { longWaitSeconds, retryAfterSeconds } from '@sluice/admission';
import type { PoolConfig } from '@sluice/config';
import {
  BODY_KEY_GRACE_MS,
  bullPriority,
  decodePoolStats,
  QUEUE_EVENTS_MAX_LEN,
  type JobPayload,
  type KeySpace,
  type LongPromptStats,
  type QueueLevel,
} from '@sluice/protocol';
import type { Redis } from '@sluice/redis';
import { Job, Queue } from 'bullmq';
import { ADMISSION_CODES, admitAndAdd } from './admission.js';
import { withTimeout } from './timeout.js';

/** What became of a job the gateway tried to take back from the queue. */
export type QueuedRemoval = 'removed' | 'taken' | 'missing';

/** Why a job was not added: the pool's depth bound, its tenant's `maxQueued`, or a drain. */
export type AddRefusal = 'queue_full' | 'tenant_queue_full' | 'pool_draining';

/** The admission script's answers below zero. */
const refusals: Record<number, AddRefusal> = {
  [ADMISSION_CODES.queueFull]: 'queue_full',
  [ADMISSION_CODES.tenantQueueFull]: 'tenant_queue_full',
  [ADMISSION_CODES.poolDraining]: 'pool_draining',
};

/** The tenant a job is queued for, and its own bound (absent: none). */
export interface QueuedTenant {
  name: string;
  maxQueued?: number;
}

const CACHE_MS = 1000;

/**
 * How long a lease found missing, where the read before found it held, is taken for a
 * hand-over in progress rather than a pool without dispatchers. A standby polls every
 * min(ttl/3, 250 ms) and its attempt is bounded by the 1 s command timeout, so one that is
 * there leads within 1.25 s of the key's disappearance (a SIGTERM deletes it; a crash leaves
 * it for its TTL, during which it still reads as held); 2 s leaves room for a loaded host.
 */
export const HANDOVER_GRACE_MS = 2000;

/**
 * What this replica knows of a pool's lease. `held`: the last read found it; `handover`: the
 * read after that did not; `none`: never seen, or still missing when the grace ended.
 */
type LeaderState = 'held' | 'handover' | 'none';

export class PoolQueue {
  readonly queue: Queue;
  private readonly waitKey: string;
  private readonly prioritizedKey: string;
  private readonly delayedKey: string;
  private readonly controlKey: string;
  private readonly jobKeyPrefix: string;
  private leader: { state: LeaderState; until: number } = { state: 'none', until: 0 };
  private leaderRead: Promise<boolean> | undefined;
  private stats: {
    drainPerSecond: number | undefined;
    longs: LongPromptStats | undefined;
    until: number;
  } = { drainPerSecond: undefined, longs: undefined, until: 0 };
  private lastQueued = 0;

  constructor(
    readonly pool: PoolConfig,
    private readonly keys: KeySpace,
    private readonly redis: Redis,
    private readonly bullConnection: Redis,
    private readonly maxPriority: number,
    private readonly now: () => number,
  ) {
    const name = keys.queueName(pool.name);
    this.queue = new Queue(name, {
      connection: bullConnection,
      prefix: keys.prefix,
      streams: { events: { maxLen: QUEUE_EVENTS_MAX_LEN } },
    });
    // Every key the admission script touches, those it builds from jobKeyPrefix included,
    // carries the pool's hash tag: on a Cluster the script runs on one slot.
    this.waitKey = keys.queueKey(pool.name, 'wait');
    this.prioritizedKey = keys.queueKey(pool.name, 'prioritized');
    this.delayedKey = keys.queueKey(pool.name, 'delayed');
    this.controlKey = keys.poolControl(pool.name);
    this.jobKeyPrefix = keys.jobKey(pool.name, '');
  }

  /**
   * True when a dispatcher holds this pool's lease, or held it at the last read and the key has
   * been missing for less than HANDOVER_GRACE_MS. Why: the queue outlives its leader, and a job
   * queued while the lease changes hands is taken by the next leader, so a hand-over (a SIGTERM
   * deletes the key and a standby takes it within its 250 ms poll; a crashed leader's key
   * expires and the same follows) must refuse nobody. A cached "no leader" used to refuse every
   * request for a second when one read fell in that gap. A pool that never had a leader here
   * (gateways started before any dispatcher), or whose lease stays missing past the grace, is
   * refused at once: a job queued where nobody takes it waits its whole park limit.
   * Rejected: not caching "no leader" (a read in the gap still refuses; and one command per
   * request on a pool without dispatchers); a grace of the lease TTL (the gateway is not told
   * it, and a standby's gap is its poll, not the TTL); the leader handing the key to a standby
   * (a crash leaves the same gap at expiry). Answers are cached: held for a second, a
   * hand-over until its grace ends (then read again), none for a second; reads are shared.
   */
  async hasLeader(): Promise<boolean> {
    if (this.leader.until > this.now()) return this.leader.state !== 'none';
    this.leaderRead ??= this.readLeader().finally(() => {
      this.leaderRead = undefined;
    });
    return this.leaderRead;
  }

  private async readLeader(): Promise<boolean> {
    const held = (await this.redis.exists(this.keys.lease(this.pool.name))) === 1;
    const now = this.now();
    if (held) this.leader = { state: 'held', until: now + CACHE_MS };
    else if (this.leader.state === 'held')
      this.leader = { state: 'handover', until: now + HANDOVER_GRACE_MS };
    else this.leader = { state: 'none', until: now + CACHE_MS };
    return held || this.leader.state === 'handover';
  }

  /**
   * Adds the job unless the queue is at its depth bound or its tenant at `maxQueued`; answers
   * which bound refused it, undefined when added.
   */
  async add(
    jobId: string,
    payload: JobPayload,
    level: QueueLevel,
    tenant?: QueuedTenant,
    /** The body's bytes, for a payload that carries it in a key of its own (`bodyInKey`). */
    rawBody?: Buffer,
  ): Promise<AddRefusal | undefined> {
    const priority = bullPriority(payload.priority, this.maxPriority, level);
    const tenantKey = tenant && this.keys.tenantQueued(this.pool.name, tenant.name);
    const keys = [
      this.waitKey,
      this.prioritizedKey,
      this.delayedKey,
      this.controlKey,
      this.keys.jobBody(this.pool.name, jobId),
    ];
    if (tenantKey) keys.push(tenantKey);
    const args: Array<string | number | Buffer> = [
      this.pool.queueDepth,
      tenant?.maxQueued ?? 0,
      priority,
      this.jobKeyPrefix,
      jobId,
    ];
    if (payload.bodyInKey) {
      if (!rawBody) throw new Error(`job ${jobId} carries its body in a key but none was given`);
      args.push(rawBody, Math.max(0, payload.deadline - this.now()) + BODY_KEY_GRACE_MS);
    }
    const job = new Job(
      this.queue,
      'completion',
      payload,
      {
        jobId,
        priority,
        attempts: 1,
        // Bodies are prompts: nothing stays in Redis once a request is answered.
        removeOnComplete: true,
        removeOnFail: true,
      },
      jobId,
    );
    let queued: number;
    try {
      // BullMQ defines its scripts on the connection once it is ready.
      await this.queue.getBackend().client;
      queued = await admitAndAdd(this.bullConnection, job, { keys, args });
    } catch (err) {
      // The script may have run, or stopped part way: take the job back if it is still queued.
      await this.queue.remove(jobId).catch(() => 0);
      if (tenantKey) await this.redis.zrem(tenantKey, jobId).catch(() => 0);
      throw err;
    }
    if (queued < 0) {
      if (queued === ADMISSION_CODES.queueFull) this.lastQueued = this.pool.queueDepth;
      return refusals[queued] ?? 'queue_full';
    }
    this.lastQueued = queued + 1;
    return undefined;
  }

  /** The Redis key of a job's hash: it exists from the add until the job is removed. */
  jobKey(jobId: string): string {
    return this.keys.jobKey(this.pool.name, jobId);
  }

  /**
   * Removes a job that is still queued. `taken`: the dispatcher holds it (it runs); `missing`:
   * Redis does not have it (lost with an empty restart, or already ended). BullMQ's removeJob
   * answers 1 for a job that does not exist, so existence is read first. Both calls are
   * bounded by the command timeout.
   */
  async removeQueued(
    jobId: string,
    of: Pick<JobPayload, 'tenant' | 'bodyInKey'> = {},
  ): Promise<QueuedRemoval> {
    if ((await this.redis.exists(this.jobKey(jobId))) === 0) return 'missing';
    const removed = await withTimeout(this.queue.remove(jobId), `remove job ${jobId}`);
    if (removed !== 1) return 'taken';
    // Its tenant's place and its body's memory free at once. A member a failure leaves counts
    // against the tenant's bound until jobs ahead of it go: a refusal drops it only from among
    // the set's first TENANT_STALE_CHECKS (admission.ts), the leader's picks only before the
    // tenant's second waiting job (tenant-queues.ts). A body key left behind expires after
    // the park limit.
    const { tenant, bodyInKey } = of;
    await Promise.all([
      tenant === undefined
        ? 0
        : this.redis.zrem(this.keys.tenantQueued(this.pool.name, tenant), jobId).catch(() => 0),
      bodyInKey ? this.redis.del(this.keys.jobBody(this.pool.name, jobId)).catch(() => 0) : 0,
    ]);
    return 'removed';
  }

  /**
   * removeQueued for a caller that was not told the job's tenant or whether its body has a key
   * of its own (the parked watch, taking back jobs of a pool without a leader): both are read
   * from the job's payload first, so its tenant's place and its body's memory free as they do
   * for a client that left. `missing` when the job is not there to read.
   */
  async withdrawQueued(jobId: string): Promise<QueuedRemoval> {
    const data = await this.redis.hget(this.jobKey(jobId), 'data');
    if (data === null) return 'missing';
    return this.removeQueued(jobId, queuedAs(data));
  }

  /** The leader's published stats, read at most once a second. */
  private async readStats(): Promise<void> {
    const now = this.now();
    if (this.stats.until > now) return;
    const text = await this.redis.get(this.keys.poolStats(this.pool.name)).catch(() => null);
    let drainPerSecond: number | undefined;
    let longs: LongPromptStats | undefined;
    try {
      const stats = text ? decodePoolStats(text) : undefined;
      drainPerSecond = stats?.drainPerSecond;
      longs = stats?.longs;
    } catch {
      drainPerSecond = undefined;
    }
    this.stats = { drainPerSecond, longs, until: now + CACHE_MS };
  }

  /**
   * Seconds a new long prompt would wait for its prefill to start, from the long prompts the
   * leader holds and prefills and its measured prefill rate; undefined while unknown.
   */
  async longWait(): Promise<number | undefined> {
    await this.readStats();
    const longs = this.stats.longs;
    if (longs === undefined) return undefined;
    return longWaitSeconds({
      tokensAhead: longs.heldTokens + longs.prefillRemainingTokens,
      prefillTokensPerSecond: longs.prefillTokensPerSecond,
      parallelPrefills: longs.parallelPrefills,
    });
  }

  /**
   * The pool is draining (`sluice pool drain`), as the admission script reads it. Read apart
   * only where a request is refused before any add: a drained pool without a leader says it
   * is draining, the operator's choice, rather than that nobody leads it.
   */
  async isDraining(): Promise<boolean> {
    return (await this.redis.get(this.controlKey)) === 'draining';
  }

  /** Seconds a refused client should wait, from the leader's published drain rate. */
  async retryAfter(): Promise<number> {
    await this.readStats();
    return retryAfterSeconds({
      queued: this.lastQueued,
      drainPerSecond: this.stats.drainPerSecond,
    });
  }

  close(): Promise<void> {
    return this.queue.close();
  }
}

/**
 * The tenant and body key of a job's payload as BullMQ stores it (JSON). A payload that does not
 * parse yields neither: its tenant's member is then dropped by the next tenant refusal, and a
 * body key expires after the park limit (docs/broker.md, "Nothing left behind").
 */
function queuedAs(data: string): Pick<JobPayload, 'tenant' | 'bodyInKey'> {
  let payload: unknown;
  try {
    payload = JSON.parse(data);
  } catch {
    return {};
  }
  if (typeof payload !== 'object' || payload === null) return {};
  const { tenant, bodyInKey } = payload as Record<string, unknown>;
  return {
    ...(typeof tenant === 'string' ? { tenant } : {}),
    ...(bodyInKey === true ? { bodyInKey } : {}),
  };
}

/**
 * Whether each pool has a leader, as requests would be answered (`hasLeader`: cached a second,
 * a hand-over forgiven): what `/readyz` and `sluice_pool_has_leader` both report. Unknown
 * (undefined) while Redis does not answer or the read fails: requests get
 * `redis_unavailable` then, not `no_leader`.
 */
export function readLeaders(
  pools: ReadonlyMap<string, PoolQueue>,
  redisUp: boolean,
): Promise<Array<readonly [string, boolean | undefined]>> {
  return Promise.all(
    [...pools.values()].map(
      async (p) =>
        [p.pool.name, redisUp ? await p.hasLeader().catch(() => undefined) : undefined] as const,
    ),
  );
}
