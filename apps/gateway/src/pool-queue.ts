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
import { isCluster, type Redis } from '@sluice/redis';
import { Job, Queue } from 'bullmq';
import type { ChainableCommander } from 'ioredis';
import { withTimeout } from './timeout.js';

/** What became of a job the gateway tried to take back from the queue. */
export type QueuedRemoval = 'removed' | 'taken' | 'missing';

/** Why a job was not added: the pool's depth bound, its tenant's `maxQueued`, or a drain. */
export type AddRefusal = 'queue_full' | 'tenant_queue_full' | 'pool_draining';

/** The admission script's answers below zero. */
const refusals: Record<number, AddRefusal> = {
  [-1]: 'queue_full',
  [-2]: 'tenant_queue_full',
  [-3]: 'pool_draining',
};

/** The tenant a job is queued for, and its own bound (absent: none). */
export interface QueuedTenant {
  name: string;
  maxQueued?: number;
}

// Admission to the queue, exact across replicas and concurrent requests, for clients and
// for anyone reading the queue: this script and BullMQ's add run in one MULTI, so nothing
// runs between the count and the add. It counts the pool's queued jobs (plain wait list +
// prioritised set + long prompts the dispatcher holds back in the delayed set) and refuses
// at the bound by leaving a short-lived placeholder under the job's key (KEYS[4]): the add
// behind it in the transaction finds the id taken and, as BullMQ documents for a duplicate
// job id, adds nothing. Reserving a place beforehand instead (a sorted set, a ZREM after)
// cost three more commands per request for the same exactness.
//
// With tenants, the job also joins its tenant's queued set (KEYS[5]), bounded by the tenant's
// maxQueued (ARGV[3], 0 = none) in the same script, so the bound is exact across replicas
// too. Members whose job is gone are dropped before a refusal, so only jobs still queued (or
// running, until the dispatcher drops them at release) count.
//
// An operator's drain (`sluice pool drain`, the pool's control key KEYS[5] = 'draining') is
// read here too: the refusal costs no round trip of its own and holds from the moment the
// key is written, on every replica at once, with nothing cached.
// KEYS: wait, prioritized, delayed, job key, control, [tenant set]. ARGV: bound, placeholder
// ms, tenant bound, priority, job key prefix, job id.
const admitScript = `local function refuse(code)
  redis.call('hset', KEYS[4], 'sluiceRefused', '1')
  redis.call('pexpire', KEYS[4], ARGV[2])
  return code
end
if redis.call('get', KEYS[5]) == 'draining' then return refuse(-3) end
local n = redis.call('llen', KEYS[1]) + redis.call('zcard', KEYS[2]) + redis.call('zcard', KEYS[3])
if n >= tonumber(ARGV[1]) then return refuse(-1) end
if KEYS[6] then
  local bound = tonumber(ARGV[3])
  if bound > 0 and redis.call('zcard', KEYS[6]) >= bound then
    for _, id in ipairs(redis.call('zrange', KEYS[6], 0, -1)) do
      if redis.call('exists', ARGV[5] .. id) == 0 then redis.call('zrem', KEYS[6], id) end
    end
    if redis.call('zcard', KEYS[6]) >= bound then return refuse(-2) end
  end
  redis.call('zadd', KEYS[6], ARGV[4], ARGV[6])
end
return n`;

/** How long a refusal's placeholder keeps the job id taken, should its removal not arrive. */
const PLACEHOLDER_MS = 10_000;

const CACHE_MS = 1000;

/** What the admission transaction's first command is queued on. */
type Evaluator = Pick<Redis, 'eval'> | Pick<ChainableCommander, 'eval'>;

/**
 * Runs `admit` and then BullMQ's add of `job` in one MULTI on BullMQ's connection and answers
 * EXEC's results. On a single Redis the transaction is sent as plain commands, all issued in
 * one synchronous block, so no other command of this process comes between MULTI and EXEC
 * (each answers QUEUED): an ioredis pipeline object would do the same but costs about 80 us
 * to create on a connection that carries BullMQ's 64 scripts. A Cluster only runs
 * transactions as pipelines (all keys in the pool's slot), so it pays that.
 */
async function admitAndAdd(
  conn: Redis,
  bullClient: unknown,
  job: Job,
  admit: (on: Evaluator) => unknown,
): Promise<[Error | null, unknown][] | null> {
  if (isCluster(conn)) {
    // BullMQ's transaction is ioredis's, with BullMQ's scripts added.
    const transaction = (bullClient as { multi(): ChainableCommander }).multi();
    admit(transaction);
    // Its outcome is read from EXEC's results (a command queued in a transaction answers with
    // the transaction itself).
    job.addJob(transaction as never).catch(() => {});
    return transaction.exec();
  }
  const replies = [
    conn.multi({ pipeline: false }),
    admit(conn),
    // BullMQ's client is a proxy that runs its scripts on this very connection.
    job.addJob(bullClient as never),
  ];
  const executed = conn.exec();
  try {
    await Promise.all(replies);
  } catch (err) {
    // Wait for every reply before the caller takes the job back.
    await Promise.allSettled([...replies, executed]);
    throw err;
  }
  return executed;
}

/** Loads every script ioredis has defined on `client` (BullMQ's) into Redis's script cache. */
async function loadScripts(client: Redis): Promise<void> {
  const scripts = Object.values(client.scriptsSet as Record<string, { lua: string }>);
  await Promise.all(scripts.map((script) => client.script('LOAD', script.lua)));
}

export class PoolQueue {
  readonly queue: Queue;
  private readonly waitKey: string;
  private readonly prioritizedKey: string;
  private readonly delayedKey: string;
  private readonly controlKey: string;
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
    // Every key the admission script touches, those it builds from jobKeyPrefix included,
    // carries the pool's hash tag: on a Cluster the script runs on one slot.
    this.waitKey = keys.queueKey(pool.name, 'wait');
    this.prioritizedKey = keys.queueKey(pool.name, 'prioritized');
    this.delayedKey = keys.queueKey(pool.name, 'delayed');
    this.controlKey = keys.poolControl(pool.name);
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
    retry = true,
  ): Promise<AddRefusal | undefined> {
    const priority = bullPriority(payload.priority, this.maxPriority, level);
    const keys = [
      this.waitKey,
      this.prioritizedKey,
      this.delayedKey,
      this.jobKey(jobId),
      this.controlKey,
    ];
    const args: Array<string | number> = [
      this.pool.queueDepth,
      PLACEHOLDER_MS,
      tenant?.maxQueued ?? 0,
      priority,
      this.jobKeyPrefix,
      jobId,
    ];
    if (tenant) keys.push(this.keys.tenantQueued(this.pool.name, tenant.name));
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
    const conn = this.bullConnection;
    let results: [Error | null, unknown][] | null;
    try {
      results = await admitAndAdd(conn, await this.queue.getBackend().client, job, (tx) =>
        tx.eval(admitScript, keys.length, ...keys, ...args),
      );
    } catch (err) {
      // The transaction may have run: take the job back if it is still queued.
      await this.queue.remove(jobId).catch(() => 0);
      throw err;
    }
    const [admitted, added] = results ?? [];
    if (!admitted || !added) throw new Error('the admission transaction was discarded');
    // A transaction does not stop at a failed command: the add may have run.
    if (admitted[0]) {
      await this.queue.remove(jobId).catch(() => 0);
      throw admitted[0];
    }
    const queued = Number(admitted[1]);
    if (queued < 0) {
      if (queued === -1) this.lastQueued = this.pool.queueDepth;
      // Gone before the refusal is answered; it would expire on its own should Redis be away.
      await this.redis.del(this.jobKey(jobId)).catch(() => {});
      return refusals[queued] ?? 'queue_full';
    }
    if (added[0]) {
      if (tenant) await this.redis.zrem(keys[5]!, jobId).catch(() => 0);
      // Redis forgot BullMQ's scripts (SCRIPT FLUSH) while this connection had sent them:
      // inside a transaction ioredis does not resend them, so they are loaded and the
      // whole admission runs again (nothing was added).
      if (retry && /NOSCRIPT/.test(added[0].message)) {
        await loadScripts(conn);
        return this.add(jobId, payload, level, tenant, false);
      }
      throw added[0];
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
