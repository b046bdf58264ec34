// One pool: the lease, the release loop, exact in-flight accounting per engine.
//
// Only the lease holder takes jobs (BullMQ worker without a processor: getNextJob only
// while the gate admits). A job the prefill rules may not release yet is held back
// (held-jobs.ts) so that the jobs behind it can pass. In-flight is counted here,
// synchronously, before any await, so the cap is exact; the queue's BullMQ global concurrency is set to the pool's total cap
// as a Redis-enforced backstop against two processes that both believe they lead.
import {
  bypassTraffic,
  classify,
  gateDecision,
  pickEngine,
  releaseVerdict,
  smoothRate,
  type GatePolicy,
  type PrefillView,
} from '@sluice/admission';
import type { MaxInflightSource, PoolConfig } from '@sluice/config';
import {
  createEngineObserver,
  type EngineObserver,
  type ObservedEngine,
} from '@sluice/engine-metrics';
import { markStage, type DispatcherMetrics } from '@sluice/observability';
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
import { PoolLoad } from './degrade.js';
import { EngineClient, type EngineTimeouts } from './engine-call.js';
import { Holding } from './holding.js';
import {
  emptyCounters,
  longPromptStats,
  PrefillRate,
  scraped,
  settlePending,
  trackRelease,
  type PrefillCounters,
  type ReleasedWork,
} from './prefill-tracker.js';
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
  /** Gauge conditions of the gate (KV threshold, fail mode, freshness). */
  policy: GatePolicy;
  scrape: { intervalMs: number; staleAfterFailures: number };
  maxInflightSource: MaxInflightSource;
  /** SLUICE_MAX_PRIORITY, to compute a held job's BullMQ priority when it is promoted. */
  maxPriority: number;
  /** Highest GPU utilization of the latest fresh reading, if a GPU source runs. */
  gpuUtilization: () => number | undefined;
  log: {
    info(o: object, m: string): void;
    warn(o: object, m: string): void;
    error(o: object, m: string): void;
  };
  now: () => number;
}

interface EngineSlot extends PrefillView, PrefillCounters {
  client: EngineClient;
  observer: EngineObserver;
  /** The observed state behind `gauges` and `health`. */
  observed?: ObservedEngine;
  degraded: boolean;
  /**
   * Lowest in-flight count since the previous scrape. A scrape can only have counted our
   * requests that were released before it: taking the lowest count of the window leaves out
   * the ones released while it was on the wire, so they are never mistaken for ours on the
   * engine and bypass traffic is never underestimated (it errs toward holding back).
   */
  inflightFloor: number;
  /** The engine's prefill histogram sums at the previous scrape. */
  prefillTotals?: { promptTokens: number; seconds: number } | undefined;
}

export class PoolDispatcher {
  readonly queue: Queue;
  readonly worker: Worker;
  readonly lease: Lease;
  private readonly engines: EngineSlot[];
  private readonly inflightJobs = new Map<
    string,
    { job: Job; token: string; work: ReleasedWork }
  >();
  private readonly holding: Holding;
  private readonly prefillRate = new PrefillRate();
  private wake: (() => void) | undefined;
  private loopRunning: Promise<void> | undefined;
  private closing = false;
  private tokenCounter = 0;
  private timers: NodeJS.Timeout[] = [];
  private releasedSinceStats = 0;
  private drainPerSecond: number | undefined;
  private lastStatsAt: number;
  private readonly load: PoolLoad;
  private queuedNow = 0;

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
      // The longest a blocked take sleeps when no marker wakes it (a job added or promoted
      // while BullMQ counted the queue as full, e.g. during a hold in flight).
      drainDelay: 1,
    });
    this.worker.on('error', (err) =>
      deps.log.error({ err, pool: pool.name }, 'bullmq worker error'),
    );
    this.engines = pool.engines.map((config) => ({
      ...emptyCounters(),
      name: config.name,
      lane: config.lane,
      inflight: 0,
      cap: config.maxInflight,
      health: 'unknown' as const,
      degraded: false,
      inflightFloor: 0,
      client: new EngineClient(config, deps.timeouts),
      observer: createEngineObserver({
        name: config.name,
        url: config.url,
        intervalMs: deps.scrape.intervalMs,
        staleAfterFailures: deps.scrape.staleAfterFailures,
        ...(config.apiKey ? { apiKey: config.apiKey } : {}),
        now: deps.now,
      }),
    }));
    this.holding = new Holding({
      pool: pool.name,
      queue: this.queue,
      redis: deps.redis,
      metrics: deps.metrics,
      log: deps.log,
      longPrompts: pool.longPrompts,
      maxPriority: deps.maxPriority,
      isLeader: () => this.lease.isLeader,
      context: (now) => {
        for (const engine of this.engines) settlePending(engine, now);
        return { engines: this.engines, policy: pool.longPrompts, gate: deps.policy, now };
      },
      changed: () => this.changed(),
      now: deps.now,
    });
    for (const engine of this.engines)
      engine.observer.on('change', (state) => this.observed(engine, state));
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
    this.load = new PoolLoad(pool.degradation);
    this.setLoadMetrics();
  }

  get totalCap(): number {
    return this.engines.reduce((sum, e) => sum + e.cap, 0);
  }

  get inflight(): number {
    return this.inflightJobs.size;
  }

  async start(): Promise<void> {
    // Scrape every engine once before contending for the lease: no ungated first interval.
    await Promise.all(this.engines.map((e) => e.observer.start()));
    await this.worker.waitUntilReady();
    void this.worker.startStalledCheckTimer();
    void this.lease.start();
    const lockRenewal = setInterval(
      () => void this.extendLocks(),
      Math.max(100, Math.floor(this.deps.leaseTtlMs / 4)),
    );
    const stats = setInterval(() => void this.publishStats(), 1000);
    // The load signal is sampled at the scrape cadence, so the EMA weighs readings evenly.
    const load = setInterval(() => this.sampleLoad(), this.deps.scrape.intervalMs);
    this.timers.push(lockRenewal, stats, load);
  }

  async close(): Promise<void> {
    this.closing = true;
    for (const t of this.timers) clearInterval(t);
    await this.lease.stop();
    this.wake?.();
    await this.worker.close(true);
    await this.loopRunning;
    await this.queue.close();
    await Promise.all(this.engines.map((e) => Promise.all([e.client.close(), e.observer.stop()])));
  }

  private onAcquired(): void {
    const { log, metrics } = this.deps;
    log.info({ pool: this.pool.name, cap: this.totalCap }, 'lease acquired: releasing jobs');
    metrics.leader.set({ pool: this.pool.name }, 1);
    void this.queue
      .setGlobalConcurrency(this.totalCap)
      .catch((err: unknown) => log.error({ err }, 'setGlobalConcurrency failed'));
    void this.holding.adopt();
    this.loopRunning ??= this.releaseLoop().finally(() => {
      this.loopRunning = undefined;
    });
  }

  private onLost(): void {
    this.deps.log.warn({ pool: this.pool.name }, 'lease lost: stopped releasing');
    this.deps.metrics.leader.set({ pool: this.pool.name }, 0);
    this.holding.forget();
    this.wake?.();
  }

  /** Something the gate or the prefill rules read changed: look again. */
  private changed(): void {
    this.wake?.();
    this.holding.maybePromote();
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
      const index = pickEngine(this.engines, this.deps.policy, this.deps.now());
      const open = index !== -1;
      if (open !== gateWasOpen) {
        metrics.gateOpen.set(poolLabel, open ? 1 : 0);
        if (!open) metrics.gateClosed.inc({ ...poolLabel, reason: this.closedReason() });
        gateWasOpen = open;
      }
      // Never take with the gate closed, a promoted held job included: BullMQ's global
      // concurrency would be reached too, and a slot freed by a completion adds no marker to
      // wake a blocked take (moveToFinished without fetchNext), so the take would sleep a
      // whole drainDelay. A promoted job waits at the head of the queue for the gate.
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
      markStage('dispatcher.job');
      if (!this.lease.isLeader || this.closing) {
        // Lost the lease while blocked: the job goes back untouched for the new leader.
        await job.moveToWait(token).catch(() => {});
        break;
      }
      this.place(job, token);
    }
    metrics.gateOpen.set(poolLabel, 0);
  }

  private discard(job: Job, token: string, reason: string): Promise<void> {
    this.deps.metrics.skipped.inc({ pool: this.pool.name, reason });
    return job.moveToFailed(new Error(reason), token, false).then(
      () => {},
      () => {},
    );
  }

  /**
   * A job taken past its deadline. Its gateway answers `503 park_timeout` at the deadline when
   * it can still remove the job from the queue; when this dispatcher took it at that very
   * moment, it cannot, and waits for a frame: this one.
   */
  private expire(job: Job, token: string, payload: JobPayload): Promise<void> {
    const { hub, keys } = this.deps;
    const relay = hub.open(job.id!, keys.replyChannel(payload.replica));
    relay.error({
      code: 'park_timeout',
      message: `no capacity within ${Math.round(this.pool.maxParkSeconds)} s; retry later`,
    });
    hub.close(relay);
    return this.discard(job, token, 'past_deadline');
  }

  /** Releases a job just taken, or holds it back when the release order says it must wait. */
  private place(job: Job, token: string): void {
    const { log, now } = this.deps;
    const jobId = job.id!;
    this.holding.taken(jobId);
    let payload: JobPayload;
    try {
      payload = validateJobPayload(job.data);
    } catch (err) {
      log.error({ jobId, err: (err as ProtocolError).message }, 'invalid job payload');
      void this.discard(job, token, 'invalid_payload');
      return;
    }
    // A job whose dispatcher died (its lock expired) is moved back by the stalled check with
    // a deferred failure (maxStalledCount 0): it may have run partly, so it is failed, never
    // run twice. A job this loop put back itself (moveToWait) carries none and runs normally.
    if (job.deferredFailure) return void this.discard(job, token, 'stalled');
    const at = now();
    if (payload.deadline < at) return void this.expire(job, token, payload);
    const promptTokens = payload.promptTokens ?? 0;
    const candidate = {
      id: jobId,
      promptTokens,
      long: classify(promptTokens, this.pool.longPrompts) === 'long',
      priority: payload.priority,
      enqueuedAt: payload.enqueuedAt,
    };
    const verdict = releaseVerdict(candidate, this.holding.context(at));
    if (verdict.go)
      this.release(job, token, this.engines[verdict.engine]!, payload, candidate.long);
    else void this.holding.hold(job, token, payload, { ...candidate, job }, verdict.reason);
  }

  /** Counts the job in flight at once, then checks and runs it without blocking the loop. */
  private release(
    job: Job,
    token: string,
    engine: EngineSlot,
    payload: JobPayload,
    long: boolean,
  ): void {
    const { metrics, now } = this.deps;
    const labels = { pool: this.pool.name, engine: engine.name };
    engine.inflight += 1;
    const work = trackRelease(engine, {
      long,
      promptTokens: payload.promptTokens ?? 0,
      stream: payload.stream,
      releasedAt: now(),
      rate: this.prefillRate,
      changed: () => {
        this.setPrefillMetrics(engine);
        this.changed();
      },
    });
    this.setPrefillMetrics(engine);
    this.inflightJobs.set(job.id!, { job, token, work });
    metrics.inflight.set(labels, engine.inflight);
    void this.run(job, token, engine, payload, work).finally(() => {
      engine.inflight -= 1;
      engine.inflightFloor = Math.min(engine.inflightFloor, engine.inflight);
      this.inflightJobs.delete(job.id!);
      metrics.inflight.set(labels, engine.inflight);
      work.finished();
    });
  }

  private async run(
    job: Job,
    token: string,
    engine: EngineSlot,
    payload: JobPayload,
    work: ReleasedWork,
  ): Promise<void> {
    const { metrics, hub, cancels, keys, now, log } = this.deps;
    const pool = this.pool.name;
    const jobId = job.id!;
    const skip = (reason: string) => this.discard(job, token, reason);
    if (!(await this.deps.replicas.isAlive(payload.replica))) return skip('client_gone');
    const controller = cancels.register(jobId);
    if (!controller) return skip('cancelled');

    let degraded;
    try {
      degraded = this.load.apply(payload.body, payload.path, payload.optOut === true);
    } catch (err) {
      // The gateway validated the body; should a rewrite still fail, the request goes as sent.
      log.error(
        { jobId, err: (err as Error).message },
        'degradation rewrite failed: sending the body unchanged',
      );
      degraded = { body: payload.body, state: 'normal', degraded: false };
    }
    if (degraded.degraded) metrics.degraded.inc({ pool, state: degraded.state });
    const relay = hub.open(jobId, keys.replyChannel(payload.replica));
    metrics.released.inc({ pool, engine: engine.name });
    this.releasedSinceStats += 1;
    relay.start({ engine: engine.name, loadState: degraded.state });
    let outcome;
    markStage('dispatcher.engine-call');
    try {
      outcome = await engine.client.call(
        payload.path,
        degraded.body,
        relay,
        controller.signal,
        () => work.firstByte(now()),
      );
    } finally {
      cancels.unregister(jobId);
      hub.close(relay);
    }
    metrics.completed.inc({ pool, outcome });
    if (outcome === 'ok') await job.moveToCompleted('ok', token, false).catch(() => {});
    else await job.moveToFailed(new Error(outcome), token, false).catch(() => {});
  }

  /** One reading of the pool's load signal into the degradation state machine. */
  private sampleLoad(): void {
    const now = this.deps.now();
    let kvUsage: number | undefined;
    for (const e of this.engines)
      if (e.health === 'healthy' && e.gauges && now - e.gauges.at <= this.deps.policy.maxGaugeAgeMs)
        kvUsage = Math.max(kvUsage ?? 0, e.gauges.kvUsage);
    const gpuUtilization = this.deps.gpuUtilization();
    const queuePressure =
      this.pool.queueDepth > 0 ? Math.min(1, this.queuedNow / this.pool.queueDepth) : undefined;
    const before = this.load.profile;
    if (this.load.update({ kvUsage, gpuUtilization, queuePressure })) {
      this.deps.log.info(
        { pool: this.pool.name, from: before, to: this.load.profile, signal: this.load.smoothed },
        'load state changed',
      );
    }
    this.setLoadMetrics();
  }

  private setLoadMetrics(): void {
    const { metrics } = this.deps;
    for (const profile of this.pool.degradation.profiles)
      metrics.loadState.set(
        { pool: this.pool.name, state: profile.name },
        profile.name === this.load.profile ? 1 : 0,
      );
    if (this.load.smoothed !== undefined)
      metrics.loadSignal.set({ pool: this.pool.name }, this.load.smoothed);
  }

  /** Wakes the release loop: a scrape, a GPU reading or a completion changed the picture. */
  poke(): void {
    this.changed();
  }

  /** Why the gate is closed, as the first engine's decision says. */
  private closedReason(): string {
    const decision = gateDecision(this.engines[0]!, this.deps.policy, this.deps.now());
    return decision.admit ? 'unknown' : decision.reason;
  }

  private observed(engine: EngineSlot, state: ObservedEngine): void {
    const { metrics, log } = this.deps;
    const labels = { pool: this.pool.name, engine: engine.name };
    const previous = engine.observed;
    engine.observed = state;
    engine.health = state.health;
    if (state.vllm && state.scrapedAt !== undefined && state.scrapedAt !== previous?.scrapedAt) {
      // The broker's own requests the scrape saw, so they are not counted twice when the
      // gate estimates the traffic that bypassed it (see `inflightFloor`).
      engine.gauges = {
        running: state.vllm.running,
        waiting: state.vllm.waiting,
        kvUsage: state.vllm.kvUsage,
        at: state.scrapedAt,
        inflightAtScrape: engine.inflightFloor,
      };
      engine.inflightFloor = engine.inflight;
      scraped(engine, state.vllm.kvCapacityTokens);
      this.samplePrefillRate(engine, state.vllm.prefillTotals);
      metrics.engineRunning.set(labels, state.vllm.running);
      metrics.engineWaiting.set(labels, state.vllm.waiting);
      metrics.engineKvUsage.set(labels, state.vllm.kvUsage);
      metrics.engineBypass.set(labels, bypassTraffic(engine.gauges));
      metrics.engineLastScrape.set(labels, state.scrapedAt / 1000);
      this.checkMaxNumSeqs(engine, state.vllm.maxNumSeqs);
    }
    metrics.engineUp.set(labels, state.health === 'healthy' ? 1 : 0);
    if (previous && state.staleTransitions > previous.staleTransitions) {
      metrics.engineStale.inc(labels, state.staleTransitions - previous.staleTransitions);
      log.warn(
        { ...labels, failures: state.consecutiveFailures, err: state.lastError },
        'engine state stale: gauge conditions now follow ADMISSION_FAIL_MODE',
      );
    }
    if (state.degraded !== engine.degraded) {
      engine.degraded = state.degraded;
      metrics.observerDegraded.set(labels, state.degraded ? 1 : 0);
      if (state.degraded)
        log.error(
          { ...labels, err: state.lastError },
          'engine /metrics answers but does not look like vLLM: gating on the in-flight cap only',
        );
    }
    this.changed();
  }

  /** The engine's own prefill rate since the previous scrape (see PrefillRate). */
  private samplePrefillRate(
    engine: EngineSlot,
    totals: { promptTokens: number; seconds: number } | undefined,
  ): void {
    const previous = engine.prefillTotals;
    engine.prefillTotals = totals;
    if (!totals || !previous) return;
    this.prefillRate.sampleEngine(
      totals.promptTokens - previous.promptTokens,
      totals.seconds - previous.seconds,
    );
    this.setPrefillMetrics();
  }

  /** Long prompts in flight and in prefill on `engine`, and the pool's prefill rate. */
  private setPrefillMetrics(engine?: EngineSlot): void {
    const { metrics } = this.deps;
    if (engine) {
      const labels = { pool: this.pool.name, engine: engine.name };
      metrics.longInflight.set(labels, engine.longInflight);
      metrics.longInPrefill.set(labels, engine.longInPrefill);
    }
    if (this.prefillRate.current !== undefined)
      metrics.prefillRate.set({ pool: this.pool.name }, this.prefillRate.current);
  }

  /** The cap follows the engine's own --max-num-seqs where the engine exports it. */
  private checkMaxNumSeqs(engine: EngineSlot, maxNumSeqs: number | undefined): void {
    if (maxNumSeqs === undefined || maxNumSeqs === engine.cap) return;
    const labels = { pool: this.pool.name, engine: engine.name };
    if (this.deps.maxInflightSource === 'default') {
      this.deps.log.warn(
        { ...labels, from: engine.cap, to: maxNumSeqs },
        "cap set from the engine's max_num_seqs",
      );
      engine.cap = maxNumSeqs;
      this.deps.metrics.inflightLimit.set(labels, engine.cap);
      if (this.lease.isLeader) void this.queue.setGlobalConcurrency(this.totalCap).catch(() => {});
    } else {
      this.deps.log.error(
        { ...labels, cap: engine.cap, maxNumSeqs },
        "ADMISSION_MAX_INFLIGHT differs from the engine's max_num_seqs: the cap is not the engine's",
      );
    }
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
      const counts = await this.queue.getJobCounts('wait', 'prioritized', 'active', 'delayed');
      this.queuedNow =
        (counts['wait'] ?? 0) + (counts['prioritized'] ?? 0) + (counts['delayed'] ?? 0);
      const queue = {
        wait: counts['wait'] ?? 0,
        prioritized: counts['prioritized'] ?? 0,
        active: counts['active'] ?? 0,
        delayed: counts['delayed'] ?? 0,
      };
      for (const [state, n] of Object.entries(counts)) metrics.queueDepth.set({ pool, state }, n);
      if (!this.lease.isLeader) return;
      await this.holding.prune();
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
        queue,
        loadState: this.load.profile,
        longs: longPromptStats({
          held: this.holding.held.longTokens(),
          released: [...this.inflightJobs.values()].map((j) => j.work),
          rate: this.prefillRate,
          parallelPrefills:
            this.engines.filter((e) => e.lane !== 'short').length *
            this.pool.longPrompts.maxInPrefill,
          now: at,
        }),
        engines: this.engines.map((e) => {
          const decision = gateDecision(e, this.deps.policy, at);
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
      this.deps.log.warn({ err, pool }, 'publishing pool stats failed');
    }
  }
}
