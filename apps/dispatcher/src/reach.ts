// Engine requests whose client can no longer be reached are cancelled, freeing their engine
// slots instead of generating for nobody. Three signals:
// - the gateway replica holding the client is dead: its liveness key is gone (checked for the
//   replicas of running jobs every replica TTL / 3, one pipelined EXISTS), or a reply frame
//   published on its channel reached no subscriber (`unheard`);
// - Redis has been unreachable for the loss grace: no frame can reach any client, and the
//   gateways have answered their held clients by then (SLUICE_REDIS_LOSS_GRACE_SECONDS).
import type { KeySpace, RejectReason } from '@sluice/protocol';
import { redisHealthy, type Redis } from '@sluice/redis';
import type { CancelBook } from './cancels.js';
import type { InflightJob, InflightLedger } from './ledger.js';

export interface ReachDeps {
  redis: Redis;
  keys: KeySpace;
  cancels: CancelBook;
  ledgers: () => readonly InflightLedger[];
  /** False right after Redis came back: live replicas may not have beaten or resubscribed yet. */
  replicasSettled: () => boolean;
  replicaTtlMs: number;
  lossGraceMs: number;
  log: { info(o: object, m: string): void; warn(o: object, m: string): void };
  now: () => number;
}

export class Reach {
  private readonly timers: NodeJS.Timeout[] = [];
  private readonly cancelled = new WeakSet<InflightJob>();
  private lastReachedAt: number;
  private lost = false;
  private checking = false;

  constructor(private readonly deps: ReachDeps) {
    this.lastReachedAt = deps.now();
  }

  start(): void {
    const { replicaTtlMs, lossGraceMs } = this.deps;
    this.timers.push(
      setInterval(() => void this.checkReplicas(), Math.max(50, Math.floor(replicaTtlMs / 3))),
      setInterval(() => void this.checkRedis(), Math.max(50, Math.min(1000, lossGraceMs / 5))),
    );
  }

  stop(): void {
    for (const t of this.timers) clearInterval(t);
  }

  /** A frame published on `channel` reached no subscriber: its replica holds no clients. */
  unheard(channel: string): void {
    if (!this.deps.replicasSettled()) return;
    this.cancelWhere(
      (e) => this.deps.keys.replyChannel(e.payload.replica) === channel,
      'cancelled',
      'no gateway listens on the reply channel',
    );
  }

  private running(): InflightJob[] {
    return this.deps.ledgers().flatMap((l) => l.values());
  }

  private cancelWhere(
    match: (e: InflightJob) => boolean,
    code: RejectReason,
    reason: string,
  ): number {
    let n = 0;
    for (const entry of this.running()) {
      if (!match(entry) || this.cancelled.has(entry)) continue;
      this.cancelled.add(entry);
      this.deps.cancels.cancel(entry.id, reason, code);
      n += 1;
    }
    if (n > 0)
      this.deps.log.warn({ jobs: n, reason }, 'cancelled engine requests nobody can receive');
    return n;
  }

  /** One pipelined EXISTS for the replicas of the running jobs. */
  async checkReplicas(): Promise<void> {
    const replicas = [...new Set(this.running().map((e) => e.payload.replica))];
    if (replicas.length === 0 || this.checking || !this.deps.replicasSettled()) return;
    this.checking = true;
    try {
      const pipeline = this.deps.redis.pipeline();
      for (const r of replicas) pipeline.exists(this.deps.keys.replicaAlive(r));
      const results = (await pipeline.exec()) ?? [];
      const dead = new Set(
        replicas.filter((_, i) => results[i]?.[0] == null && results[i]?.[1] === 0),
      );
      if (dead.size > 0)
        this.cancelWhere((e) => dead.has(e.payload.replica), 'cancelled', 'gateway replica gone');
    } catch {
      // Redis unreachable: checkRedis owns that case.
    } finally {
      this.checking = false;
    }
  }

  async checkRedis(): Promise<void> {
    const now = this.deps.now();
    if (await redisHealthy(this.deps.redis, 500)) {
      if (this.lost) this.deps.log.info({}, 'Redis reachable again');
      this.lost = false;
      this.lastReachedAt = now;
      return;
    }
    if (now - this.lastReachedAt < this.deps.lossGraceMs) return;
    if (!this.lost)
      this.deps.log.warn(
        { graceMs: this.deps.lossGraceMs },
        'Redis unreachable past the loss grace: cancelling the engine requests in flight',
      );
    this.lost = true;
    this.cancelWhere(() => true, 'redis_unavailable', 'Redis unreachable');
  }
}
