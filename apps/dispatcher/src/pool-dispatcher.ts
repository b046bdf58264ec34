// One pool, composed: the lease decides whether this dispatcher leads; the release loop
// (release-loop.ts) takes jobs while it does and the gate admits; the ledger (ledger.ts)
// counts what runs; the job runner (job-runner.ts) runs it; lock renewal (lock-renewal.ts)
// keeps the jobs' locks; pool stats (pool-stats.ts) tell the gateways. Held-back jobs are in
// holding.ts; the operator's mode (pause, drain) in pool-control.ts. The queue's BullMQ
// global concurrency is set to the pool's total cap as a Redis-enforced backstop against two
// processes that both believe they lead.
import { pickEngine, type GatePolicy } from '@sluice/admission';
import type { PoolConfig, TenantConfig } from '@sluice/config';
import type { DispatcherMetrics } from '@sluice/observability';
import { QUEUE_EVENTS_MAX_LEN, type KeySpace, type PoolMode } from '@sluice/protocol';
import {
  COMMAND_TIMEOUT_MS,
  quietWorkerScripts,
  waitingAfterTake,
  type Redis,
} from '@sluice/redis';
import { Queue, type Worker } from 'bullmq';
import type { CancelBook } from './cancels.js';
import { PoolLoad } from './degrade.js';
import type { EngineTimeouts } from './engine-call.js';
import { createEngineSlot, observeEngine, type EngineSlot } from './engine-slot.js';
import { FairShare } from './fair-share.js';
import { Holding } from './holding.js';
import { PoolWorker } from './job-build.js';
import { JobRunner } from './job-runner.js';
import { Lease } from './lease.js';
import { InflightLedger, type InflightJob } from './ledger.js';
import { LockRenewal } from './lock-renewal.js';
import { PoolControl } from './pool-control.js';
import { PoolStats } from './pool-stats.js';
import { PrefillRate, settlePending } from './prefill-tracker.js';
import type { RelayHub } from './relay.js';
import { queueProbe } from './queue-probe.js';
import { ReleaseLoop } from './release-loop.js';
import { resetBlocking, takeStallMs, TakeWatchdog, type TakeWatchView } from './take-watchdog.js';
import { limitedWarn } from './warn-limit.js';
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
  /** Whether this dispatcher may try to take the pool's lease now (lease-choice.ts). */
  mayAcquire?: () => boolean;
  timeouts: EngineTimeouts;
  /** Gauge conditions of the gate (KV threshold, fail mode, freshness). */
  policy: GatePolicy;
  scrape: { intervalMs: number; staleAfterFailures: number };
  /** The configured tenants; absent: no fair share (one anonymous tenant). */
  tenants?: readonly TenantConfig[];
  /** Highest GPU utilization of the latest fresh reading, if a GPU source runs. */
  gpuUtilization: () => number | undefined;
  log: {
    info(o: object, m: string): void;
    warn(o: object, m: string): void;
    error(o: object, m: string): void;
  };
  now: () => number;
}

export class PoolDispatcher {
  readonly queue: Queue;
  readonly worker: Worker;
  readonly lease: Lease;
  readonly ledger: InflightLedger;
  private readonly engines: EngineSlot[];
  private readonly holding: Holding;
  private readonly prefillRate = new PrefillRate();
  private readonly loop: ReleaseLoop;
  private readonly runner: JobRunner;
  private readonly locks: LockRenewal;
  private readonly stats: PoolStats;
  private readonly load: PoolLoad;
  private readonly fairShare: FairShare | undefined;
  private readonly control: PoolControl;
  /** Leads, and has read the mode and the fair-share counters since it won the lease. */
  private releasing = false;
  private closing = false;
  private timers: NodeJS.Timeout[] = [];
  /** The take watchdog's episodes (take-watchdog.ts), its bound, and its queue reading. */
  private readonly takeWatch = new TakeWatchdog();
  private readonly takeStallMs: number;
  private readonly probeWaiting: () => Promise<number>;
  private watchingTakes = false;

  constructor(
    readonly pool: PoolConfig,
    private readonly deps: PoolDispatcherDeps,
  ) {
    const { keys, bullConnection, leaseTtlMs, metrics, log, now } = deps;
    const name = pool.name;
    const queueName = keys.queueName(name);
    this.queue = new Queue(queueName, {
      connection: bullConnection,
      prefix: keys.prefix,
      streams: { events: { maxLen: QUEUE_EVENTS_MAX_LEN } },
    });
    // Its takes build a job whose data is not JSON instead of throwing (job-build.ts).
    this.worker = new PoolWorker(queueName, null, {
      connection: bullConnection,
      prefix: keys.prefix,
      autorun: false,
      // Our locks live as long as the lease: a dead leader's jobs are found stalled within
      // about one TTL, and with maxStalledCount 0 they are failed, never run twice.
      lockDuration: leaseTtlMs,
      stalledInterval: Math.max(500, Math.floor(leaseTtlMs / 5)),
      maxStalledCount: 0,
      // The longest a blocked take sleeps when no marker wakes it and no job is delayed (one
      // that is makes BullMQ block until it is due, up to 10 s). The completion and the hold
      // set the marker for jobs added while BullMQ counted the queue as full (marker-rearm.ts
      // in libs/redis), so this is a backstop.
      drainDelay: 1,
    });
    // Without listeners, BullMQ prints every connection error of an outage as a stack trace.
    const warn = limitedWarn(log);
    this.worker.on('error', (err) => warn('bullmq worker error', err, { pool: name }));
    this.queue.on('error', (err) => warn('bullmq queue error', err, { pool: name }));
    this.engines = pool.engines.map((config) =>
      createEngineSlot(config, { timeouts: deps.timeouts, scrape: deps.scrape, now }),
    );
    this.holding = new Holding({
      pool: name,
      queue: this.queue,
      redis: deps.redis,
      metrics,
      log,
      longPrompts: pool.longPrompts,
      isLeader: () => this.lease.isLeader,
      context: (at) => {
        for (const engine of this.engines) settlePending(engine, at);
        return { engines: this.engines, policy: pool.longPrompts, gate: deps.policy, now: at };
      },
      changed: () => this.changed(),
      now,
    });
    const observation = {
      pool: name,
      metrics,
      policy: deps.policy,
      prefillRate: this.prefillRate,
      log,
      capChanged: () => {
        if (this.lease.isLeader)
          void this.queue.setGlobalConcurrency(this.totalCap).catch(() => {});
      },
      changed: () => this.changed(),
      onEngineBy: (engine: EngineSlot, sentAt: number) => this.ledger.onEngineBy(engine, sentAt),
    };
    for (const engine of this.engines) {
      engine.observer.on('change', (state) => observeEngine(observation, engine, state));
      metrics.inflightLimit.set({ pool: name, engine: engine.name }, engine.cap);
    }
    this.lease = new Lease(
      deps.redis,
      keys.lease(name),
      deps.id,
      leaseTtlMs,
      { acquired: () => this.onAcquired(), lost: () => this.onLost() },
      (err) => warn('lease renewal failed', err, { pool: name }),
      deps.mayAcquire ? { mayAcquire: deps.mayAcquire } : {},
    );
    // A standby says so from the start: SluiceNoLeader finds a pool whose leader died by
    // its standbys' 0s, not only once one of them has led.
    metrics.leader.set({ pool: name }, 0);
    // At 0 from the start: an alert's increase() then sees the first stall (deploy/prometheus).
    metrics.takeStalls.inc({ pool: name }, 0);
    this.control = new PoolControl({
      pool: name,
      key: keys.poolControl(name),
      redis: deps.redis,
      changed: (mode, before) => this.modeChanged(mode, before),
      warn,
    });
    this.load = new PoolLoad(pool.degradation);
    this.fairShare =
      deps.tenants && deps.tenants.length > 0
        ? new FairShare({
            pool: name,
            tenants: deps.tenants,
            keys,
            redis: deps.redis,
            bull: deps.bullConnection,
            queue: this.queue,
            lease: this.lease,
            metrics,
            log,
          })
        : undefined;
    this.ledger = new InflightLedger({
      pool: name,
      metrics,
      prefillRate: this.prefillRate,
      now,
      changed: () => this.changed(),
    });
    this.stats = new PoolStats({
      id: deps.id,
      pool,
      keys,
      redis: deps.redis,
      queue: this.queue,
      engines: this.engines,
      ledger: this.ledger,
      holding: this.holding,
      prefillRate: this.prefillRate,
      policy: deps.policy,
      metrics,
      isLeader: () => this.lease.isLeader,
      loadState: () => this.load.profile,
      mode: () => this.control.mode,
      fairShare: this.fairShare,
      now,
      failed: (err) => warn('publishing pool stats failed', err, { pool: name }),
    });
    this.runner = new JobRunner({
      pool: name,
      keys,
      redis: deps.redis,
      hub: deps.hub,
      cancels: deps.cancels,
      replicas: deps.replicas,
      metrics,
      load: this.load,
      maxParkSeconds: pool.maxParkSeconds,
      log,
      now,
      released: () => this.stats.released(),
      fairShare: this.fairShare,
    });
    this.locks = new LockRenewal({
      worker: this.worker,
      ledger: this.ledger,
      lockDurationMs: leaseTtlMs,
      lost: (entry) => this.lockLost(entry),
      failed: (err) => warn('extending job locks failed', err, { pool: name }),
    });
    this.loop = new ReleaseLoop({
      id: deps.id,
      pool,
      worker: this.worker,
      waitingAfterTake: () => waitingAfterTake(deps.bullConnection, this.worker.keys.wait!),
      engines: this.engines,
      policy: deps.policy,
      holding: this.holding,
      ledger: this.ledger,
      runner: this.runner,
      fairShare: this.fairShare,
      metrics,
      // The reply path must be up too: a job released while the command connection is still
      // reconnecting (a SIGSTOP or a partition just ended) would run with its frames stuck,
      // and its gateway would take the finished, removed job for one Redis lost.
      mayTake: () => this.mayTake(),
      answered: () => this.takeWatch.answered(),
      log,
      now,
    });
    // The watchdog counts waiting jobs on the command connection, bounded like its every
    // command: a hung BullMQ connection is what it looks for.
    this.probeWaiting = queueProbe(deps.redis, this.worker);
    this.takeStallMs = takeStallMs(leaseTtlMs);
    this.setLoadMetrics();
  }

  /**
   * Whether the release loop may take. The reply path must be up too: a job released while
   * the command connection is still reconnecting (a SIGSTOP or a partition just ended) would
   * run with its frames stuck, and its gateway would take the finished, removed job for one
   * Redis lost. A pause ends the loop like a lost lease: a job a blocked take still got goes
   * back to the front of its priority (moveToWait), and a run that ends hands its slot to nobody.
   */
  private mayTake(): boolean {
    return (
      this.lease.isLeader &&
      !this.closing &&
      this.deps.redis.status === 'ready' &&
      this.control.mode !== 'paused'
    );
  }

  get totalCap(): number {
    return this.engines.reduce((sum, e) => sum + e.cap, 0);
  }

  get inflight(): number {
    return this.ledger.size;
  }

  async start(): Promise<void> {
    // Scrape every engine once before contending for the lease: no ungated first interval.
    await Promise.all(this.engines.map((e) => e.observer.start()));
    await this.worker.waitUntilReady();
    // BullMQ has loaded its scripts on the connection: its take and completion run without
    // the events stream from the first job on (libs/redis bull-scripts.ts).
    quietWorkerScripts(this.deps.bullConnection);
    await this.control.refresh();
    void this.worker.startStalledCheckTimer();
    void this.lease.start();
    this.locks.start();
    this.deps.redis.on('ready', this.onRedisReady);
    const stats = setInterval(() => {
      // The backstop for a control message this dispatcher missed (pool-control.ts); a
      // standby reads it too, so that its first snapshot as leader shows the right mode.
      void this.control.refresh();
      void this.stats.publish();
      if (this.lease.isLeader) void this.fairShare?.flush();
      void this.watchTakes();
    }, 1000);
    // The load signal is sampled at the scrape cadence, so the EMA weighs readings evenly.
    const load = setInterval(() => this.sampleLoad(), this.deps.scrape.intervalMs);
    this.timers.push(stats, load);
  }

  /**
   * Stops taking and hands the lease over at once (the key is deleted: a standby leads within
   * one of its attempts), lets the jobs in flight finish with their locks renewed, then
   * closes. The release loop ends before the worker closes: a take blocked at the handover
   * returns within BullMQ's drainDelay, and a job it got goes back to the queue while the
   * worker can still move it; closing the worker under it would strand the job active with a
   * lock nobody renews, to be failed by the next leader's stalled check. The locks of the jobs
   * in flight are renewed until they end: stopping the renewal first (as before) let them
   * expire mid-stream, and the new leader's stalled check failed jobs still being served.
   */
  async close(): Promise<void> {
    this.closing = true;
    this.deps.redis.off('ready', this.onRedisReady);
    for (const t of this.timers) clearInterval(t);
    // The next leader goes on from the counters as they are now, with the output reserved for
    // runs still in flight charged (their settlement would come after this last write).
    if (this.lease.isLeader) {
      this.fairShare?.handOver();
      await this.fairShare?.flush();
    }
    await this.lease.stop();
    // A take blocks at most BullMQ's block timeout (10 s with delayed jobs), unless Redis is
    // away: then only closing the worker (after the jobs in flight ended) frees it, and
    // closing BullMQ's objects is not waited for (they would wait for Redis).
    const redisAway = () => this.deps.bullConnection.status !== 'ready';
    const ended = await settleWithin(this.loop.stopped(), 11_000, redisAway);
    await this.ledger.idle();
    this.locks.stop();
    await settleWithin(this.worker.close(true), 5000, redisAway);
    if (!ended) await settleWithin(this.loop.stopped(), 1000);
    await settleWithin(this.queue.close(), 5000, redisAway);
    await Promise.all(this.engines.map((e) => Promise.all([e.client.close(), e.observer.stop()])));
  }

  private takeWatchView(): Omit<TakeWatchView, 'waiting'> {
    const now = this.deps.now();
    return {
      now,
      unansweredSince: this.loop.unansweredSince,
      admits: pickEngine(this.engines, this.deps.policy, now) !== -1,
      mayTake: this.mayTake(),
      stallMs: this.takeStallMs,
    };
  }

  /**
   * The take watchdog's check, each stats tick; never rejects. Once the loop has gone a whole
   * bound without an answer while the gate admits, the queue is read; with jobs waiting,
   * BullMQ's connections are reset and the hung take is abandoned. The worker's blocking
   * connection is reset always (it carries only the marker's BZPOPMIN), the shared one (every
   * pool's: main.ts) only when a read of this pool's keys gets no answer on it within a
   * command's bound. A reset connection resends what it had not had answered (ioredis): a job
   * a resent take moves a second time (the first answer lost) is never run, it stays active
   * under a lock nobody renews and the stalled check fails it. The loop then stops waiting for
   * its take and takes again; a job the abandoned take still gets goes back to the queue
   * (release-loop.ts `abandonTake`). Nothing in the ledger changes: the cap stays exact.
   */
  private async watchTakes(): Promise<void> {
    if (this.watchingTakes || !this.takeWatch.due(this.takeWatchView())) return;
    this.watchingTakes = true;
    try {
      let waiting: number;
      try {
        waiting = await this.probeWaiting();
      } catch {
        return; // Redis does not answer the command connection either: the loss paths act.
      }
      const view = { ...this.takeWatchView(), waiting };
      const action = this.takeWatch.check(view);
      if (!action.recover) return;
      const { bullConnection, keys, metrics, log } = this.deps;
      const pool = this.pool.name;
      const sharedAnswers = await settleWithin(
        bullConnection.exists(keys.queueKey(pool, 'meta')),
        COMMAND_TIMEOUT_MS,
      );
      if (action.first) {
        metrics.takeStalls.inc({ pool });
        log.warn(
          {
            pool,
            waiting,
            unansweredMs: view.now - view.unansweredSince!,
            sharedConnection: sharedAnswers ? 'answering: kept' : 'not answering: reset',
          },
          "release loop stalled: jobs wait, the gate admits, and no take was answered; resetting BullMQ's connections and taking again",
        );
      }
      if (!sharedAnswers) bullConnection.disconnect(true);
      // Not waited for: it lasts until Redis answers, and the next check must not wait on it.
      void resetBlocking(this.worker).catch((err: unknown) =>
        log.warn({ pool, err }, "resetting the worker's blocking connection failed"),
      );
      this.loop.abandonTake();
      this.loop.wake();
    } finally {
      this.watchingTakes = false;
    }
  }

  /** The job's lock could not be extended: another dispatcher may run it; stop ours. */
  private lockLost(entry: InflightJob): void {
    this.deps.log.warn(
      { pool: this.pool.name, jobId: entry.id },
      'job lock lost: cancelling its engine request',
    );
    this.deps.cancels.cancel(entry.id, 'the dispatcher lost the job', 'dispatcher_lost');
  }

  /** The command connection is back: a loop that stopped for it starts again if we lead. */
  private readonly onRedisReady = () => {
    if (this.releasing && !this.closing) this.loop.start();
  };

  /** `sluice pool` changed this pool's mode: read it now (the control channel's nudge). */
  controlChanged(): void {
    void this.control.refresh();
  }

  private modeChanged(mode: PoolMode, before: PoolMode): void {
    this.deps.log.info({ pool: this.pool.name, mode, before }, 'pool mode changed');
    if (mode === 'paused') this.loop.wake();
    else if (this.releasing && !this.closing) this.loop.start();
    // Published at once: `sluice pool` waits for the leader to show the new mode.
    if (this.lease.isLeader) void this.stats.publish();
  }

  private onAcquired(): void {
    const { log, metrics } = this.deps;
    log.info({ pool: this.pool.name, cap: this.totalCap }, 'lease acquired: releasing jobs');
    metrics.leader.set({ pool: this.pool.name }, 1);
    this.stats.leading();
    void this.queue
      .setGlobalConcurrency(this.totalCap)
      .catch((err: unknown) => log.error({ err }, 'setGlobalConcurrency failed'));
    void this.holding.adopt();
    // The mode and the counters first: a paused pool releases nothing after a failover, and
    // the first pick is the previous leader's next one.
    void Promise.all([this.control.refresh(), this.fairShare?.load()]).finally(() => {
      if (!this.lease.isLeader) return;
      this.releasing = true;
      this.loop.start();
    });
  }

  private onLost(): void {
    // Closing hands the lease over on purpose (a rolling update): nothing for an operator.
    if (this.closing) this.deps.log.info({ pool: this.pool.name }, 'lease handed over: closing');
    else this.deps.log.warn({ pool: this.pool.name }, 'lease lost: stopped releasing');
    this.deps.metrics.leader.set({ pool: this.pool.name }, 0);
    this.releasing = false;
    this.holding.forget();
    this.loop.wake();
  }

  /** Something the gate or the prefill rules read changed: look again. */
  private changed(): void {
    this.loop.wake();
    this.holding.maybePromote();
  }

  /** Wakes the release loop: a scrape, a GPU reading or a completion changed the picture. */
  poke(): void {
    this.changed();
  }

  /** One reading of the pool's load signal into the degradation state machine. */
  private sampleLoad(): void {
    const now = this.deps.now();
    let kvUsage: number | undefined;
    for (const e of this.engines)
      if (e.health === 'healthy' && e.gauges && now - e.gauges.at <= this.deps.policy.maxGaugeAgeMs)
        kvUsage = Math.max(kvUsage ?? 0, e.gauges.kvUsage);
    const gpuUtilization = this.deps.gpuUtilization();
    const queueDepth = this.pool.queueDepth;
    const queuePressure =
      queueDepth > 0 ? Math.min(1, this.stats.queuedNow / queueDepth) : undefined;
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
}

/**
 * Waits for `promise` (its rejection included) at most `ms`, or until `giveUp` says waiting
 * is pointless; true when it settled.
 */
async function settleWithin(
  promise: Promise<unknown>,
  ms: number,
  giveUp: () => boolean = () => false,
): Promise<boolean> {
  let timer: NodeJS.Timeout | undefined;
  let poll: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([
      promise.then(
        () => true,
        () => true,
      ),
      new Promise<boolean>((resolve) => {
        timer = setTimeout(() => resolve(false), ms);
        poll = setInterval(() => giveUp() && resolve(false), 100);
      }),
    ]);
  } finally {
    clearTimeout(timer);
    clearInterval(poll);
  }
}
