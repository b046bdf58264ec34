// One pool: the lease, the release loop, exact in-flight accounting per engine.
//
// Only the lease holder takes jobs (BullMQ worker without a processor: getNextJob only
// while the gate admits). In-flight is counted here, synchronously, before any await, so
// the cap is exact; the queue's BullMQ global concurrency is set to the pool's total cap
// as a Redis-enforced backstop against two processes that both believe they lead.
import { gateDecision, pickEngine, smoothRate, type EngineView } from '@sluice/admission';
import type { PoolConfig } from '@sluice/config';
import type { DispatcherMetrics } from '@sluice/observability';
import {
  encodePoolStats,
  ProtocolError,
  validateJobPayload,
  type JobPayload,
  type KeySpace,
} from '@sluice/protocol';
import type { Redis } from '@sluice/redis';
import { Queue, Worker, type Job } from 'bullmq';
import type { CancelBook } from './cancels.js';
import { EngineClient, type EngineTimeouts } from './engine-call.js';
import { Lease } from './lease.js';
import type { RelayHub } from './relay.js';
import type { ReplicaLiveness } from './replicas.js';

export interface PoolDispatcherDeps {
  id: string;
  keys: KeySpace;
  /** Connection for commands (lease, stats, liveness checks). */
  redis: Redis;
  /** Connection handed to BullMQ (it duplicates one for blocking reads). */
  bullConnection: Redis;
  hub: RelayHub;
  cancels: CancelBook;
  replicas: ReplicaLiveness;
  metrics: DispatcherMetrics;
  leaseTtlMs: number;
  timeouts: EngineTimeouts;
  log: {
    info(o: object, m: string): void;
    warn(o: object, m: string): void;
    error(o: object, m: string): void;
  };
  now: () => number;
}

interface EngineSlot extends EngineView {
  client: EngineClient;
}

export class PoolDispatcher {
  readonly queue: Queue;
  readonly worker: Worker;
  readonly lease: Lease;
  private readonly engines: EngineSlot[];
  private readonly inflightJobs = new Map<string, { job: Job; token: string }>();
  private wake: (() => void) | undefined;
  private loopRunning: Promise<void> | undefined;
  private closing = false;
  private tokenCounter = 0;
  private timers: NodeJS.Timeout[] = [];
  private releasedSinceStats = 0;
  private drainPerSecond: number | undefined;
  private lastStatsAt: number;

  constructor(
    readonly pool: PoolConfig,
    private readonly deps: PoolDispatcherDeps,
  ) {
    const { keys, bullConnection, leaseTtlMs } = deps;
    const queueName = keys.queueName(pool.name);
    this.queue = new Queue(queueName, { connection: bullConnection, prefix: keys.prefix });
    this.worker = new Worker(queueName, null, {
      connection: bullConnection,
      prefix: keys.prefix,
      autorun: false,
      // Our locks live as long as the lease: a dead leader's jobs are found stalled within
      // about one TTL, and with maxStalledCount 0 they are failed, never run twice.
      lockDuration: leaseTtlMs,
      stalledInterval: Math.max(500, Math.floor(leaseTtlMs / 5)),
      maxStalledCount: 0,
      drainDelay: 5,
    });
    this.worker.on('error', (err) =>
      deps.log.error({ err, pool: pool.name }, 'bullmq worker error'),
    );
    this.engines = pool.engines.map((config) => ({
      name: config.name,
      inflight: 0,
      cap: config.maxInflight,
      client: new EngineClient(config, deps.timeouts),
    }));
    for (const e of this.engines)
      deps.metrics.inflightLimit.set({ pool: pool.name, engine: e.name }, e.cap);
    this.lease = new Lease(
      deps.redis,
      keys.lease(pool.name),
      deps.id,
      leaseTtlMs,
      { acquired: () => this.onAcquired(), lost: () => this.onLost() },
      (err) => deps.log.warn({ err, pool: pool.name }, 'lease renewal failed'),
    );
    this.lastStatsAt = deps.now();
  }

  get totalCap(): number {
    return this.engines.reduce((sum, e) => sum + e.cap, 0);
  }

  get inflight(): number {
    return this.inflightJobs.size;
  }

  async start(): Promise<void> {
    await this.worker.waitUntilReady();
    void this.worker.startStalledCheckTimer();
    void this.lease.start();
    const lockRenewal = setInterval(
      () => void this.extendLocks(),
      Math.max(100, Math.floor(this.deps.leaseTtlMs / 4)),
    );
    const stats = setInterval(() => void this.publishStats(), 1000);
    this.timers.push(lockRenewal, stats);
  }

  async close(): Promise<void> {
    this.closing = true;
    for (const t of this.timers) clearInterval(t);
    await this.lease.stop();
    this.wake?.();
    await this.worker.close(true);
    await this.loopRunning;
    await this.queue.close();
    await Promise.all(this.engines.map((e) => e.client.close()));
  }

  private onAcquired(): void {
    const { log, metrics } = this.deps;
    log.info({ pool: this.pool.name, cap: this.totalCap }, 'lease acquired: releasing jobs');
    metrics.leader.set({ pool: this.pool.name }, 1);
    void this.queue
      .setGlobalConcurrency(this.totalCap)
      .catch((err: unknown) => log.error({ err }, 'setGlobalConcurrency failed'));
    this.loopRunning ??= this.releaseLoop().finally(() => {
      this.loopRunning = undefined;
    });
  }

  private onLost(): void {
    this.deps.log.warn({ pool: this.pool.name }, 'lease lost: stopped releasing');
    this.deps.metrics.leader.set({ pool: this.pool.name }, 0);
    this.wake?.();
  }

  /** Resolves when a slot frees or the lease changes. */
  private waitForWake(): Promise<void> {
    return new Promise((resolve) => {
      this.wake = () => {
        this.wake = undefined;
        resolve();
      };
    });
  }

  private async releaseLoop(): Promise<void> {
    const { metrics } = this.deps;
    const poolLabel = { pool: this.pool.name };
    let gateWasOpen = true;
    while (this.lease.isLeader && !this.closing) {
      const index = pickEngine(this.engines);
      const open = index !== -1;
      if (open !== gateWasOpen) {
        metrics.gateOpen.set(poolLabel, open ? 1 : 0);
        if (!open) {
          const reason = gateDecision(this.engines[0]!);
          metrics.gateClosed.inc({
            ...poolLabel,
            reason: reason.admit ? 'unknown' : reason.reason,
          });
        }
        gateWasOpen = open;
      }
      if (!open) {
        await this.waitForWake();
        continue;
      }
      const token = `${this.deps.id}:${(this.tokenCounter += 1)}`;
      let job: Job | undefined;
      try {
        job = await this.worker.getNextJob(token, { block: true });
      } catch (err) {
        if (this.closing) break;
        this.deps.log.error({ err, pool: this.pool.name }, 'getNextJob failed');
        await new Promise((r) => setTimeout(r, 200));
        continue;
      }
      if (!job) continue;
      if (!this.lease.isLeader || this.closing) {
        // Lost the lease while blocked: the job goes back untouched for the new leader.
        await job.moveToWait(token).catch(() => {});
        break;
      }
      const chosen = pickEngine(this.engines);
      if (chosen === -1) {
        await job.moveToWait(token).catch(() => {});
        continue;
      }
      this.release(job, token, this.engines[chosen]!);
    }
    metrics.gateOpen.set(poolLabel, 0);
  }

  /** Counts the job in flight at once, then checks and runs it without blocking the loop. */
  private release(job: Job, token: string, engine: EngineSlot): void {
    engine.inflight += 1;
    this.inflightJobs.set(job.id!, { job, token });
    this.deps.metrics.inflight.set({ pool: this.pool.name, engine: engine.name }, engine.inflight);
    void this.run(job, token, engine).finally(() => {
      engine.inflight -= 1;
      this.inflightJobs.delete(job.id!);
      this.deps.metrics.inflight.set(
        { pool: this.pool.name, engine: engine.name },
        engine.inflight,
      );
      this.wake?.();
    });
  }

  private async run(job: Job, token: string, engine: EngineSlot): Promise<void> {
    const { metrics, hub, cancels, keys, now, log } = this.deps;
    const pool = this.pool.name;
    const jobId = job.id!;
    let payload: JobPayload;
    try {
      payload = validateJobPayload(job.data);
    } catch (err) {
      metrics.skipped.inc({ pool, reason: 'invalid_payload' });
      log.error({ jobId, err: (err as ProtocolError).message }, 'invalid job payload');
      await job.moveToFailed(new Error('invalid payload'), token, false).catch(() => {});
      return;
    }
    const skip = async (reason: string) => {
      metrics.skipped.inc({ pool, reason });
      await job.moveToFailed(new Error(reason), token, false).catch(() => {});
    };
    // A job taken before (its dispatcher died and the stalled check moved it back, with a
    // deferred failure in BullMQ 6) may have run partly: it is failed, never run twice.
    if (job.deferredFailure || job.attemptsStarted > 1) return skip('stalled');
    if (payload.deadline < now()) return skip('past_deadline');
    if (!(await this.deps.replicas.isAlive(payload.replica))) return skip('client_gone');
    const controller = cancels.register(jobId);
    if (!controller) return skip('cancelled');

    const relay = hub.open(jobId, keys.replyChannel(payload.replica));
    metrics.released.inc({ pool, engine: engine.name });
    this.releasedSinceStats += 1;
    relay.start({ engine: engine.name, loadState: 'normal' });
    let outcome;
    try {
      outcome = await engine.client.call(payload.path, payload.body, relay, controller.signal);
    } finally {
      cancels.unregister(jobId);
      hub.close(relay);
    }
    metrics.completed.inc({ pool, outcome });
    if (outcome === 'ok') await job.moveToCompleted('ok', token, false).catch(() => {});
    else await job.moveToFailed(new Error(outcome), token, false).catch(() => {});
  }

  private async extendLocks(): Promise<void> {
    if (this.inflightJobs.size === 0) return;
    const ids: string[] = [];
    const tokens: string[] = [];
    for (const [id, { token }] of this.inflightJobs) {
      ids.push(id);
      tokens.push(token);
    }
    await this.worker.extendJobLocks(ids, tokens, this.deps.leaseTtlMs).catch((err: unknown) => {
      this.deps.log.warn({ err }, 'extending job locks failed');
    });
  }

  private async publishStats(): Promise<void> {
    const { redis, keys, now, metrics } = this.deps;
    const at = now();
    const pool = this.pool.name;
    try {
      const counts = await this.queue.getJobCounts('wait', 'prioritized', 'active');
      for (const [state, n] of Object.entries(counts)) metrics.queueDepth.set({ pool, state }, n);
      if (!this.lease.isLeader) return;
      this.drainPerSecond = smoothRate(
        this.drainPerSecond,
        this.releasedSinceStats,
        (at - this.lastStatsAt) / 1000,
      );
      this.releasedSinceStats = 0;
      this.lastStatsAt = at;
      const stats = encodePoolStats({
        leader: this.deps.id,
        at,
        drainPerSecond: this.drainPerSecond,
        engines: this.engines.map((e) => ({ name: e.name, inflight: e.inflight, cap: e.cap })),
      });
      await redis.set(keys.poolStats(pool), stats, 'PX', 5000);
    } catch (err) {
      this.deps.log.warn({ err, pool }, 'publishing pool stats failed');
    }
  }
}
