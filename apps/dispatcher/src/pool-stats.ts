// What the leader publishes about its pool once a second (the gateways read it for their
// admission answers and Retry-After estimates), and the queue depth metrics (exported by the
// leader only: leader-metrics.ts).
import { gateDecision, smoothRate, type GatePolicy } from '@sluice/admission';
import type { PoolConfig } from '@sluice/config';
import type { DispatcherMetrics } from '@sluice/observability';
import { encodePoolStats, poolModes, type KeySpace, type PoolMode } from '@sluice/protocol';
import type { Redis } from '@sluice/redis';
import type { Queue } from 'bullmq';
import type { EngineSlot } from './engine-slot.js';
import type { FairShare } from './fair-share.js';
import type { Holding } from './holding.js';
import type { InflightLedger } from './ledger.js';
import { oldestQueuedAt } from './oldest-queued.js';
import { longPromptStats, type PrefillRate } from './prefill-tracker.js';

export interface PoolStatsDeps {
  id: string;
  pool: PoolConfig;
  keys: KeySpace;
  redis: Redis;
  queue: Queue;
  engines: readonly EngineSlot[];
  ledger: InflightLedger;
  holding: Holding;
  prefillRate: PrefillRate;
  policy: GatePolicy;
  metrics: DispatcherMetrics;
  isLeader: () => boolean;
  loadState: () => string;
  /** The operator's mode as this dispatcher applies it (pool-control.ts). */
  mode: () => PoolMode;
  fairShare: FairShare | undefined;
  now: () => number;
  failed: (err: unknown) => void;
}

export class PoolStats {
  private releasedSinceStats = 0;
  private drainPerSecond: number | undefined;
  private lastStatsAt: number;
  /**
   * Whether jobs waited at the last reading (queued, or no engine with room): the drain rate's
   * window counts if they did at its start or its end (`smoothRate`).
   */
  private backloggedAtLastReading = false;
  /** Jobs waiting in the queue at the last reading (the degradation's queue pressure). */
  queuedNow = 0;

  constructor(private readonly deps: PoolStatsDeps) {
    this.lastStatsAt = deps.now();
  }

  released(): void {
    this.releasedSinceStats += 1;
  }

  /**
   * This dispatcher leads the pool from now. The drain rate's window starts here: counted from
   * the last tick it led (or from its start), the first rate would spread the releases of a
   * second over the whole standby time, and the gateways would send far too long a
   * Retry-After until the average caught up. Whether jobs waited at its start is the standby's
   * last reading of the queue.
   */
  leading(): void {
    this.lastStatsAt = this.deps.now();
    this.releasedSinceStats = 0;
  }

  /** One reading and publication; never rejects. */
  async publish(): Promise<void> {
    const { redis, keys, now, metrics, queue, engines, policy } = this.deps;
    const at = now();
    const pool = this.deps.pool.name;
    try {
      const counts = await queue.getJobCounts('wait', 'prioritized', 'active', 'delayed');
      this.queuedNow =
        (counts['wait'] ?? 0) + (counts['prioritized'] ?? 0) + (counts['delayed'] ?? 0);
      const depth = {
        wait: counts['wait'] ?? 0,
        prioritized: counts['prioritized'] ?? 0,
        active: counts['active'] ?? 0,
        delayed: counts['delayed'] ?? 0,
      };
      for (const [state, n] of Object.entries(counts)) metrics.queueDepth.set({ pool, state }, n);
      // Jobs wait now: queued (held long prompts count, in `delayed`), or no engine has room
      // (all at their cap or gated), so the next one would wait.
      const backlogged =
        this.queuedNow > 0 ||
        (engines.length > 0 && engines.every((e) => !gateDecision(e, policy, at).admit));
      const backloggedAtStart = this.backloggedAtLastReading;
      this.backloggedAtLastReading = backlogged;
      if (!this.deps.isLeader()) return;
      await this.deps.holding.prune();
      await this.deps.fairShare?.refresh();
      // Only windows in which jobs waited measure the drain: an idle one leaves the rate as
      // it was, where counting it as nothing released decayed it toward 0 (and Retry-After
      // to 60 s) after any idle spell.
      this.drainPerSecond = smoothRate(this.drainPerSecond, {
        released: this.releasedSinceStats,
        seconds: (at - this.lastStatsAt) / 1000,
        backlogged: backloggedAtStart || backlogged,
      });
      this.releasedSinceStats = 0;
      this.lastStatsAt = at;
      const mode = this.deps.mode();
      for (const m of poolModes) metrics.poolMode.set({ pool, mode: m }, m === mode ? 1 : 0);
      const oldest = await oldestQueuedAt(redis, keys, pool);
      // The add time is the gateway's clock: a skew never reads as a negative age.
      const oldestQueuedMs = oldest === undefined ? 0 : Math.max(0, at - oldest);
      metrics.queueOldestAge.set({ pool }, oldestQueuedMs / 1000);
      const stats = encodePoolStats({
        leader: this.deps.id,
        at,
        // 0: not known yet (no backlog seen since the lease was won); the gateways answer 5 s.
        drainPerSecond: this.drainPerSecond ?? 0,
        queue: depth,
        loadState: this.deps.loadState(),
        mode,
        oldestQueuedMs,
        longs: longPromptStats({
          held: this.deps.holding.held.longTokens(),
          released: this.deps.ledger.values().map((j) => j.work),
          rate: this.deps.prefillRate,
          parallelPrefills:
            engines.filter((e) => e.lane !== 'short').length *
            this.deps.pool.longPrompts.maxInPrefill,
          now: at,
        }),
        ...(this.deps.fairShare ? { tenants: this.deps.fairShare.view() } : {}),
        engines: engines.map((e) => {
          const decision = gateDecision(e, policy, at);
          return {
            name: e.name,
            inflight: e.inflight,
            cap: e.cap,
            open: decision.admit,
            ...(decision.admit ? {} : { reason: decision.reason }),
            health: e.health ?? 'unknown',
            ...(e.gauges
              ? {
                  running: e.gauges.running,
                  waiting: e.gauges.waiting,
                  kvUsage: e.gauges.kvUsage,
                  scrapedAt: e.gauges.at,
                }
              : {}),
          };
        }),
      });
      await redis.set(keys.poolStats(pool), stats, 'PX', 5000);
    } catch (err) {
      this.deps.failed(err);
    }
  }
}
