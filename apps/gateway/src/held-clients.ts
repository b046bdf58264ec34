// Every client this replica holds, through what can go wrong around it: the reply
// connection lost, Redis silent or the reply subscriber deaf (redis-loss.ts), parked jobs gone
// from Redis or left in a pool without a leader (parked-watch.ts), and a shutdown (drain.ts).
// Also the one admission check those states imply for new requests.
import type { FastifyBaseLogger } from 'fastify';
import type { Redis } from '@sluice/redis';
import { drain } from './drain.js';
import type { HeldRequest } from './held-request.js';
import { ParkedWatch, type ParkedPool } from './parked-watch.js';
import { ReplyLossWatch, type LossCause } from './redis-loss.js';
import type { Passthrough } from './passthrough.js';
import type { PoolQueue } from './pool-queue.js';
import type { RedisAnswers } from './redis-probe.js';
import type { ReplyHearing } from './reply-heartbeat.js';
import { QUEUE_LOST_MESSAGE, refusal, type Refusal } from './refuse.js';
import type { ReplyRouter } from './replies.js';

/**
 * How often parked jobs are checked for existence and their pools for a leader (also right
 * after Redis is back).
 */
export const PARKED_CHECK_MS = 1000;

export interface HeldClientsOptions {
  replies: ReplyRouter;
  /** Pass-through requests in progress: drained with the held ones. */
  passthrough: Pick<Passthrough, 'size' | 'whenIdle' | 'cutAll'>;
  /**
   * The pools' queues: a pool's parked jobs are taken back once it has no leader. Absent: only
   * their existence is watched.
   */
  pools?: ReadonlyMap<string, PoolQueue>;
  /** The command connection (bounded by its command timeout). */
  redis: Redis;
  subscriber: Redis;
  /** The probe's answers: Redis silent for the grace period is lost as a closed connection is. */
  answers?: RedisAnswers;
  /** The reply-channel heartbeat: a subscriber deaf for the grace period is lost too. */
  hearing?: ReplyHearing;
  redisLossGraceMs: number;
  drainMs: number;
  log: FastifyBaseLogger;
  parkedCheckMs?: number;
}

export class HeldClients {
  private closing = false;
  private readonly loss: ReplyLossWatch;
  private readonly parked: ParkedWatch;
  /** Jobs of clients answered while Redis was away, taken back once it answers again. */
  private orphans: (() => Promise<void>)[] = [];
  private cut: () => void = () => {};
  private readonly cutShort = new Promise<void>((resolve) => {
    this.cut = resolve;
  });
  private readonly onCommandReady = () => void this.parked.check();

  constructor(private readonly options: HeldClientsOptions) {
    const { replies, redis, subscriber, log } = options;
    this.loss = new ReplyLossWatch(subscriber, {
      graceMs: options.redisLossGraceMs,
      answers: options.answers,
      hearing: options.hearing,
      onLost: (cause) => this.redisLost(cause),
      onBack: (afterLoss) => this.redisBack(afterLoss),
    });
    this.parked = new ParkedWatch(redis, () => replies.held.values(), {
      intervalMs: options.parkedCheckMs ?? PARKED_CHECK_MS,
      // Not while deaf either: a job served meanwhile is gone with its frames, as after an outage.
      listening: () => this.loss.listening,
      onLost: (held) => {
        log.warn({ jobId: held.jobId }, 'parked job vanished from Redis');
        void held.abandon(refusal('queue_lost', QUEUE_LOST_MESSAGE), 'queue_lost')();
      },
      leaders: options.pools && {
        poolOf: (held) => poolOf(options.pools!, held),
        onLeaderless: (held, pool, retryAfter) => this.leaderless(held, pool, retryAfter),
      },
      onError: (err) => log.warn({ err }, 'parked job check failed'),
    });
    redis.on('ready', this.onCommandReady);
    this.parked.start();
  }

  /** Set from SIGTERM on: /readyz answers 503 and new requests are refused. */
  get draining(): boolean {
    return this.closing;
  }

  /** The refusal for a new request this replica cannot hold now, if any. */
  admit(kind: 'pool' | 'passthrough'): Refusal | undefined {
    if (this.closing)
      return refusal('shutting_down', 'this gateway replica is shutting down; retry');
    if (kind === 'pool' && !this.loss.connected)
      return refusal('redis_unavailable', 'queue unavailable (Redis unreachable)');
    return undefined;
  }

  /**
   * Stops taking requests and serves the held and pass-through ones for the drain period;
   * resolves once none is left (at once when none was), answering what is left at its end.
   */
  async shutdown(): Promise<void> {
    this.closing = true;
    const { replies, passthrough, drainMs, log } = this.options;
    log.info(
      { held: replies.held.size, passthrough: passthrough.size, drainSeconds: drainMs / 1000 },
      'gateway draining',
    );
    const { cut, passthroughCut } = await drain(replies, passthrough, drainMs, this.cutShort);
    if (cut + passthroughCut > 0)
      log.warn(
        { cut, passthroughCut },
        'drain period over: requests in progress answered shutting_down',
      );
    log.info('gateway drained');
  }

  /** Ends the drain period now (a second signal). */
  cutDrainShort(): void {
    this.cut();
  }

  stop(): void {
    this.loss.stop();
    this.parked.stop();
    this.options.redis.off('ready', this.onCommandReady);
  }

  /** Answers a parked client whose job the watch took back from a pool without a leader. */
  private leaderless(held: HeldRequest, pool: ParkedPool, retryAfter: number | undefined): void {
    const name = pool.pool.name;
    this.options.log.warn(
      { jobId: held.jobId, pool: name },
      'no dispatcher leads the pool: parked job taken back',
    );
    // The reason a new request for the pool gets (completions.ts), and for the same cause.
    held.fail(refusal('no_leader', `no dispatcher is leading pool ${name}`, retryAfter));
  }

  private redisLost(cause: LossCause): void {
    const held = [...this.options.replies.held.values()];
    this.options.log.warn(
      { held: held.length, graceSeconds: this.options.redisLossGraceMs / 1000, cause },
      LOST_MESSAGES[cause],
    );
    const takeBacks = held.map((h) =>
      h.abandon(
        refusal(
          'redis_unavailable',
          'queue unavailable (Redis unreachable); the request was not completed',
        ),
        'redis_unavailable',
      ),
    );
    // Deaf, Redis answers the command connection: the jobs are taken back now (removed, or
    // cancelled: the dispatchers hear cancels on their own connections), not left running
    // for nobody until this replica hears again.
    if (cause === 'deaf' && this.options.redis.status === 'ready')
      for (const takeBack of takeBacks) void takeBack();
    else this.orphans.push(...takeBacks);
  }

  private redisBack(afterLoss: boolean): void {
    const orphans = this.orphans.splice(0);
    this.options.log.info({ afterLoss, orphans: orphans.length }, 'reply connection back');
    const takeBack = () => {
      for (const orphan of orphans) void orphan();
    };
    // The take-backs go over the command connection, which may reconnect a moment later.
    if (this.options.redis.status === 'ready') takeBack();
    else this.options.redis.once('ready', takeBack);
    void this.parked.check();
  }
}

const LOST_MESSAGES: Record<LossCause, string> = {
  closed: 'reply connection lost past the grace period: answering held clients',
  silent: 'redis not answering past the grace period: answering held clients',
  deaf: 'reply channel deaf past the grace period (redis answers, no heartbeat comes back): answering held clients',
};

/** The pool whose queue holds `held`'s job: the one that names its job key so. */
function poolOf(pools: ReadonlyMap<string, PoolQueue>, held: HeldRequest): PoolQueue | undefined {
  const key = held.jobKey;
  for (const pool of pools.values()) if (pool.jobKey(held.jobId) === key) return pool;
  return undefined;
}
