// The gateway's side of one pool: adding jobs, the depth bound, leader presence and the
// Retry-After estimate. Leader presence and pool stats are read at most once a second per
// pool, not per request.
import { longWaitSeconds, retryAfterSeconds } from '@sluice/admission';
import type { PoolConfig } from '@sluice/config';
import {
  bullPriority,
  decodePoolStats,
  QUEUE_EVENTS_MAX_LEN,
  type JobPayload,
  type KeySpace,
  type LongPromptStats,
  type QueueLevel,
} from '@sluice/protocol';
import type { Redis } from '@sluice/redis';
import { Queue } from 'bullmq';
import { withTimeout } from './timeout.js';

/** What became of a job the gateway tried to take back from the queue. */
export type QueuedRemoval = 'removed' | 'taken' | 'missing';

/** Why a job was not added: the pool's depth bound, or its tenant's `maxQueued`. */
export type AddRefusal = 'queue_full' | 'tenant_queue_full';

/** The tenant a job is queued for, and its own bound (absent: none). */
export interface QueuedTenant {
  name: string;
  maxQueued?: number;
}

// Admission to the queue, exact across replicas and concurrent requests: counts the pool's
// queued jobs (plain wait list + prioritised set + long prompts the dispatcher holds back in
// the delayed set) plus the places reserved by adds still in progress, and reserves a place when under the bound. A reservation whose job already
// exists is dropped on the spot (the job is counted in the queue, or has left it), so a
// place is never counted twice; one whose gateway died mid-add expires on its own.
//
// It costs no round trip of its own: it goes on BullMQ's connection just before the add, in
// the same flight, and Redis runs commands of one connection in order. A refusal leaves a
// short-lived placeholder under the job's key, so the add that follows finds the id taken
// and, as BullMQ documents for a duplicate job id, adds nothing.
//
// With tenants, the job also joins its tenant's queued set (KEYS[5]), bounded by the tenant's
// maxQueued (ARGV[6], 0 = none) in the same script, so the bound is exact across replicas
// too. Members whose job is gone (and whose add is not in progress: its reservation is still
// there) are dropped before a refusal, so only jobs still queued (or running, until the
// dispatcher drops them at release) count.
const reserveScript = `redis.call('zremrangebyscore', KEYS[3], '-inf', ARGV[2])
for _, id in ipairs(redis.call('zrange', KEYS[3], 0, -1)) do
  if redis.call('exists', ARGV[5] .. id) == 1 then redis.call('zrem', KEYS[3], id) end
end
local function refuse(code)
  redis.call('hset', ARGV[5] .. ARGV[4], 'sluiceRefused', '1')
  redis.call('pexpire', ARGV[5] .. ARGV[4], ARGV[3])
  return code
end
local n = redis.call('llen', KEYS[1]) + redis.call('zcard', KEYS[2]) + redis.call('zcard', KEYS[3])
  + redis.call('zcard', KEYS[4])
if n >= tonumber(ARGV[1]) then return refuse(-1) end
if KEYS[5] then
  local bound = tonumber(ARGV[6])
  if bound > 0 and redis.call('zcard', KEYS[5]) >= bound then
    for _, id in ipairs(redis.call('zrange', KEYS[5], 0, -1)) do
      if redis.call('exists', ARGV[5] .. id) == 0 and not redis.call('zscore', KEYS[3], id) then
        redis.call('zrem', KEYS[5], id)
      end
    end
    if redis.call('zcard', KEYS[5]) >= bound then return refuse(-2) end
  end
  redis.call('zadd', KEYS[5], ARGV[7], ARGV[4])
end
redis.call('zadd', KEYS[3], ARGV[2] + ARGV[3], ARGV[4])
return n`;

const RESERVATION_MS = 10_000;

const CACHE_MS = 1000;

export class PoolQueue {
  readonly queue: Queue;
  private readonly waitKey: string;
  private readonly prioritizedKey: string;
  private readonly reservedKey: string;
  private readonly delayedKey: string;
  private readonly jobKeyPrefix: string;
  private leaderSeen = { value: false, until: 0 };
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
    // Every key the reserve script touches, those it builds from jobKeyPrefix included,
    // carries the pool's hash tag: on a Cluster the script runs on one slot.
    this.waitKey = keys.queueKey(pool.name, 'wait');
    this.prioritizedKey = keys.queueKey(pool.name, 'prioritized');
    this.reservedKey = keys.admissions(pool.name);
    this.delayedKey = keys.queueKey(pool.name, 'delayed');
    this.jobKeyPrefix = keys.jobKey(pool.name, '');
  }

  /** True when a dispatcher holds this pool's lease (cached for a second). */
  async hasLeader(): Promise<boolean> {
    const now = this.now();
    if (this.leaderSeen.until > now) return this.leaderSeen.value;
    const value = (await this.redis.exists(this.keys.lease(this.pool.name))) === 1;
    this.leaderSeen = { value, until: now + CACHE_MS };
    return value;
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
  ): Promise<AddRefusal | undefined> {
    const priority = bullPriority(payload.priority, this.maxPriority, level);
    const keys = [this.waitKey, this.prioritizedKey, this.reservedKey, this.delayedKey];
    const args: Array<string | number> = [
      this.pool.queueDepth,
      this.now(),
      RESERVATION_MS,
      jobId,
      this.jobKeyPrefix,
    ];
    if (tenant) {
      keys.push(this.keys.tenantQueued(this.pool.name, tenant.name));
      args.push(tenant.maxQueued ?? 0, priority);
    }
    // Sent as EVAL, not EVALSHA: ioredis resends a script Redis does not know yet with EVAL
    // after the failed EVALSHA, which would put the reservation behind the add.
    const reserved = this.bullConnection.eval(
      reserveScript,
      keys.length,
      ...keys,
      ...args,
    ) as Promise<number>;
    const added = this.queue.add('completion', payload, {
      jobId,
      priority,
      attempts: 1,
      // Bodies are prompts: nothing stays in Redis once a request is answered.
      removeOnComplete: true,
      removeOnFail: true,
    });
    // Both settle before either outcome is acted on, so no rejection goes unobserved.
    const [reservation, addition] = await Promise.allSettled([reserved, added]);
    if (reservation.status === 'rejected') {
      // The add may have run: take the job back if it is still queued, then report the error.
      await this.queue.remove(jobId).catch(() => 0);
      throw reservation.reason;
    }
    const queued = Number(reservation.value);
    if (queued < 0) {
      if (queued === -1) this.lastQueued = this.pool.queueDepth;
      // Gone before the refusal is answered; it would expire on its own should Redis be away.
      await this.redis.del(this.jobKey(jobId)).catch(() => {});
      return queued === -1 ? 'queue_full' : 'tenant_queue_full';
    }
    this.redis.zrem(this.reservedKey, jobId).catch(() => {});
    if (addition.status === 'rejected') {
      if (tenant) this.redis.zrem(this.keys.tenantQueued(this.pool.name, tenant.name), jobId);
      throw addition.reason;
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
  async removeQueued(jobId: string, tenant?: string): Promise<QueuedRemoval> {
    if ((await this.redis.exists(this.jobKey(jobId))) === 0) return 'missing';
    const removed = await withTimeout(this.queue.remove(jobId), `remove job ${jobId}`);
    if (removed !== 1) return 'taken';
    // Its tenant's place frees at once; a failure leaves a member the next refusal drops.
    if (tenant !== undefined)
      await this.redis.zrem(this.keys.tenantQueued(this.pool.name, tenant), jobId).catch(() => 0);
    return 'removed';
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
