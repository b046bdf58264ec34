// The release loop of one pool, the choosing half of the dispatcher: take a job only while
// the gate is open and this dispatcher leads, then place it: release it to the engine the
// release order names (counted by the ledger, run by the job runner) or hold it back. A run
// that ends may hand its slot straight to the next job (handover.ts) instead of a take.
import {
  classify,
  gateDecision,
  gaugesFrozen,
  pickEngine,
  releaseVerdict,
  type GatePolicy,
} from '@sluice/admission';
import type { PoolConfig } from '@sluice/config';
import { markStage, type DispatcherMetrics } from '@sluice/observability';
import { ProtocolError, validateJobPayload, type JobPayload } from '@sluice/protocol';
import type { Job, Worker } from 'bullmq';
import { reportFrozen, type EngineSlot } from './engine-slot.js';
import type { FairShare } from './fair-share.js';
import { mayHandOver, recordOutcome, type RunOutcome } from './handover.js';
import type { Holding } from './holding.js';
import { sequencesOf, type InflightJob, type InflightLedger } from './ledger.js';
import type { JobRunner } from './job-runner.js';
import { forgetWait, markDrained } from './queue-probe.js';

export interface ReleaseLoopDeps {
  id: string;
  pool: PoolConfig;
  worker: Worker;
  engines: readonly EngineSlot[];
  policy: GatePolicy;
  holding: Holding;
  ledger: InflightLedger;
  runner: JobRunner;
  metrics: DispatcherMetrics;
  /**
   * What the loop's last take left waiting, as its own script answered: 0 when no job waits
   * (BullMQ's marker cleared in it then; libs/redis take-count.ts); undefined when not known.
   */
  waitingAfterTake: () => number | undefined;
  /** The pool's fair share among tenants; absent without tenants. */
  fairShare?: FairShare;
  /** Whether this dispatcher may take jobs now (it leads and is not closing). */
  mayTake: () => boolean;
  /** A take or a handover's fetch had BullMQ's answer (take-watchdog.ts). */
  answered?: () => void;
  log: { error(o: object, m: string): void; warn(o: object, m: string): void };
  now: () => number;
}

/** A job the release order lets go now, and where. */
interface Release {
  engine: EngineSlot;
  payload: JobPayload;
  long: boolean;
}

export class ReleaseLoop {
  private wakeUp: (() => void) | undefined;
  private running: Promise<void> | undefined;
  private tokenCounter = 0;
  /**
   * In a take that waits for BullMQ's marker (the last take found the queue empty): a run
   * that ends leaves the next job to it. A take that found a job last goes straight to
   * `moveToActive`, and a handover beside it takes the job after.
   */
  private waitingForMarker = false;
  private lastTakeEmpty = true;
  /**
   * With tenants, one pick-and-take at a time: the fair share's pick, BullMQ's take of the job
   * it put in front (the loop's take or a handover's fetch) and the release that charges the
   * tenant, so each pick sees the charges of the ones before it.
   */
  private turn: Promise<unknown> = Promise.resolve();
  /**
   * Since when the loop has been taking without BullMQ's answer: set when a take starts and
   * none is unanswered, cleared when one answers (a job or none) and while the loop does not
   * take. A take that failed leaves it: the next one is still waiting for an answer.
   */
  private tryingSince: number | undefined;
  /** When a handover's fetch last had BullMQ's answer: a sign of life of the queue's side. */
  private handoverAnsweredAt: number | undefined;
  /** Ends the take that is out as abandoned; set while one is. */
  private giveUpTake: (() => void) | undefined;

  constructor(private readonly deps: ReleaseLoopDeps) {}

  /**
   * Starts the loop unless it runs already. A loop that is ending (the lease was lost while
   * it was blocked in a take) starts again at its end if the lease was re-won meanwhile.
   */
  start(): void {
    this.running ??= this.loop()
      .catch((err: unknown) => this.deps.log.error({ err }, 'release loop failed'))
      .finally(() => {
        this.running = undefined;
        if (this.deps.mayTake()) this.start();
      });
  }

  /** Resolves once the loop has ended (after `mayTake` turned false and it was woken). */
  async stopped(): Promise<void> {
    this.wake();
    await this.running;
  }

  /**
   * Since when the loop has been waiting for an answer to a take (the last handover that
   * answered counts as one); undefined while it does not take. For the take watchdog.
   */
  get unansweredSince(): number | undefined {
    const since = this.tryingSince;
    if (since === undefined || this.handoverAnsweredAt === undefined) return since;
    return Math.max(since, this.handoverAnsweredAt);
  }

  /**
   * The take watchdog found the take that is out hung: the loop stops waiting for it and takes
   * again (after the pause of a failed take). Whatever the hung take still gets later goes back
   * to the queue untouched, as a job taken after a lost lease does: nothing is placed from it,
   * so the ledger and the cap are as they were. False when no take was out.
   */
  abandonTake(): boolean {
    const giveUp = this.giveUpTake;
    giveUp?.();
    return giveUp !== undefined;
  }

  private answered(): void {
    this.tryingSince = undefined;
    this.deps.answered?.();
  }

  /** Something the gate reads changed, or the loop should check `mayTake`: look again. */
  wake(): void {
    this.wakeUp?.();
  }

  /** Runs `step` after every pick-and-take before it (see `turn`). */
  private inTurn<T>(step: () => Promise<T>): Promise<T> {
    const run = this.turn.then(step);
    this.turn = run.catch(() => {});
    return run;
  }

  /** Resolves when a slot frees or the lease changes. */
  private waitForWake(): Promise<void> {
    return new Promise((resolve) => {
      this.wakeUp = () => {
        this.wakeUp = undefined;
        resolve();
      };
    });
  }

  private async loop(): Promise<void> {
    const { metrics, engines, policy, now } = this.deps;
    const poolLabel = { pool: this.deps.pool.name };
    // Unknown at the start: the loop ended with the gauge at 0 (a lost lease, a pause, a Redis
    // outage), so a restarted loop sets it on its first turn whatever it finds.
    let gateWasOpen: boolean | undefined;
    // Why the gate was closed when last counted: a closed gate whose reason changes (KV
    // pressure, then a stale engine) is counted again with the new reason.
    let closedFor: string | undefined;
    while (this.deps.mayTake()) {
      const index = pickEngine(engines, policy, now());
      const open = index !== -1;
      if (open !== gateWasOpen) metrics.gateOpen.set(poolLabel, open ? 1 : 0);
      gateWasOpen = open;
      if (open) closedFor = undefined;
      else {
        const reason = this.closedReason();
        if (reason !== closedFor) metrics.gateClosed.inc({ ...poolLabel, reason });
        closedFor = reason;
      }
      // Never take with the gate closed, a promoted held job included: a job taken is placed
      // at once, and with no engine admitting it would be held back, or the take would wait in
      // BullMQ for a slot that BullMQ's count frees without the gate's other rules (KV cache,
      // stale gauges). A promoted job waits at the head of the queue for the gate.
      if (!open) {
        this.tryingSince = undefined;
        await this.waitForWake();
        continue;
      }
      const take = () => this.take();
      const taken = await (this.deps.fairShare ? this.inTurn(take) : take());
      if (taken === 'lost') break;
      if (taken === 'failed') await new Promise((r) => setTimeout(r, 200));
    }
    this.tryingSince = undefined;
    metrics.gateOpen.set(poolLabel, 0);
  }

  /**
   * One take: the fair share's pick first (with tenants), then BullMQ's next job, placed.
   * `lost`: the lease went meanwhile and the loop must end.
   */
  private async take(): Promise<'placed' | 'none' | 'failed' | 'lost'> {
    const { worker, fairShare } = this.deps;
    // The fair share puts the next tenant's job in front, unless a held job promoted back
    // is there: it goes first (holding.ts).
    if (fairShare) {
      if (this.deps.holding.held.promoted === undefined) await fairShare.prepareNext();
      else fairShare.promotedFirst();
    }
    const token = `${this.deps.id}:${(this.tokenCounter += 1)}`;
    let job: Job | undefined;
    const waited = (this.waitingForMarker = this.lastTakeEmpty);
    this.tryingSince ??= this.deps.now();
    const taking = worker.getNextJob(token, { block: true });
    const abandoned = new Promise<'abandoned'>(
      (resolve) => (this.giveUpTake = () => resolve('abandoned')),
    );
    try {
      const got = await Promise.race([taking, abandoned]);
      if (got === 'abandoned') {
        void taking.then((late) => late?.moveToWait(token)).catch(() => {});
        // BullMQ would not block again while it counts the hung wait as its own.
        forgetWait(worker);
        return 'failed';
      }
      job = got;
      this.answered();
    } catch (err) {
      if (!this.deps.mayTake()) return 'lost';
      this.deps.log.error({ err, pool: this.deps.pool.name }, 'getNextJob failed');
      return 'failed';
    } finally {
      this.giveUpTake = undefined;
      this.waitingForMarker = false;
      fairShare?.taken(job?.id, waited);
    }
    this.lastTakeEmpty = job === undefined;
    // The take's script cleared BullMQ's marker when it left nothing waiting.
    if (!job) return 'none';
    markStage('dispatcher.job');
    if (!this.deps.mayTake()) {
      // Lost the lease while blocked: the job goes back untouched for the new leader.
      await job.moveToWait(token).catch(() => {});
      return 'lost';
    }
    // Nothing left waiting: the next take blocks on the marker at once instead of trying an
    // empty take first (queue-probe.ts, `markDrained`). Not known: it tries, as BullMQ would.
    if (this.deps.waitingAfterTake() === 0) {
      this.lastTakeEmpty = true;
      markDrained(this.deps.worker);
    }
    this.place(job, token);
    return 'placed';
  }

  /** Releases a job just taken, or holds it back when the release order says it must wait. */
  private place(job: Job, token: string): void {
    let release: Release | undefined;
    try {
      release = this.choose(job, token);
    } catch (err) {
      // Nothing in the choice is meant to throw. Should something, the job is failed rather
      // than left active under a lock nobody renews, and the take or the run's end that placed
      // it goes on: a throw inside a run's end would be a rejection nobody handles.
      this.deps.log.error({ jobId: job.id, err }, 'placing a job failed');
      void this.deps.runner.discard(job, token, 'internal_error');
      return;
    }
    if (release) this.release(job, token, release);
  }

  /**
   * Where a job just taken goes: the engine to release it to, or undefined when it was dealt
   * with here (failed, expired, held back).
   */
  private choose(job: Job, token: string): Release | undefined {
    const { log, now, holding, runner, pool } = this.deps;
    const jobId = job.id!;
    holding.taken(jobId);
    let payload: JobPayload;
    try {
      payload = validateJobPayload(job.data);
    } catch (err) {
      log.error({ jobId, err: (err as ProtocolError).message }, 'invalid job payload');
      void runner.discard(job, token, 'invalid_payload');
      return undefined;
    }
    // A job whose dispatcher died (its lock expired) is moved back by the stalled check with
    // a deferred failure (maxStalledCount 0): it may have run partly, so it is failed, never
    // run twice. A job this loop put back itself (moveToWait) carries none and runs normally.
    // Its client is told why before the job goes: one whose `start` frame had not gone out
    // (a non-streamed job sends it with the engine's head or at the first liveness tick) is
    // still waiting as if queued, and would otherwise find the job deleted and hear
    // queue_lost, a Redis fault, from the gateway's parked watch.
    if (job.deferredFailure) {
      this.deps.fairShare?.dropped(jobId, payload);
      const message =
        'the dispatcher running this request died; it may have reached the engine, so it is not run again';
      void runner.refuse(job, token, payload, { code: 'dispatcher_lost', message }, 'stalled');
      return undefined;
    }
    const at = now();
    if (payload.deadline < at) {
      this.deps.fairShare?.dropped(jobId, payload);
      void runner.expire(job, token, payload);
      return undefined;
    }
    const promptTokens = payload.promptTokens ?? 0;
    const candidate = {
      id: jobId,
      promptTokens,
      long: classify(promptTokens, pool.longPrompts) === 'long',
      priority: payload.priority,
      enqueuedAt: payload.enqueuedAt,
      sequences: sequencesOf(payload),
    };
    const widest = this.widestCap(candidate.long);
    if (candidate.sequences > widest) {
      // More engine requests than any engine may run at once: held, it would wait to its park
      // limit; released, it would break the cap.
      this.deps.fairShare?.dropped(jobId, payload);
      const message = `n x prompts makes ${candidate.sequences} engine requests; pool ${pool.name} runs at most ${widest} at once on one engine: lower n or send fewer prompts per request`;
      void runner.refuse(job, token, payload, { code: 'bad_request', message }, 'over_cap');
      return undefined;
    }
    const verdict = releaseVerdict(candidate, holding.context(at));
    if (verdict.go)
      return { engine: this.deps.engines[verdict.engine]!, payload, long: candidate.long };
    void holding.hold(job, token, payload, { ...candidate, job }, verdict.reason);
    return undefined;
  }

  /** The largest cap among the engines that take prompts of this class (their lane). */
  private widestCap(long: boolean): number {
    let widest = 0;
    for (const engine of this.deps.engines)
      if (engine.lane !== (long ? 'short' : 'long')) widest = Math.max(widest, engine.cap);
    return widest;
  }

  /**
   * Counts the job in flight at once, then runs it without blocking the loop. From `begin` on
   * the run owns the slot: it is started before anything else, and whatever its end throws
   * (placing a job handed over included) is caught with the slot freed.
   */
  private release(job: Job, token: string, { engine, payload, long }: Release): void {
    const { ledger, runner, fairShare, log } = this.deps;
    // The probe of frozen gauges: nothing of ours was on the engine, so the rule's in-flight
    // count may have reached 0 after the last scrape. Said here, or the probe may make the
    // engine step before any scrape sees the episode.
    if (engine.inflight === 0 && gaugesFrozen(engine, this.deps.policy, this.deps.now()))
      reportFrozen({ pool: this.deps.pool.name, metrics: this.deps.metrics, log }, engine);
    const entry = ledger.begin(job, token, engine, payload, long);
    void runner
      .run(entry)
      .then((outcome) => this.settle(entry, outcome))
      .catch((err: unknown) => {
        log.error({ jobId: entry.id, err }, 'ending a run failed');
        this.free(entry, undefined);
      });
    // Charged here, in turn with the picks; the run gives the charge back should it skip the
    // job, which it can only do after its first await, so after this charge.
    fairShare?.released(entry.id, payload);
  }

  /**
   * Records how `entry`'s run ended and frees its slot, handing it to the next job when that
   * may go (see handover.ts). The slot stays counted until BullMQ answered; the job it
   * fetched is placed in the same turn the slot is freed, so the gate never sees it free.
   */
  private async settle(entry: InflightJob, outcome: RunOutcome | undefined): Promise<void> {
    const fairShare = this.deps.fairShare;
    if (outcome === undefined) return this.free(entry, undefined);
    // With tenants the fair share picks the job the handover fetches: both, and the release
    // that charges its tenant, run in turn with the loop's takes. The rule is read again in
    // turn: the takes before may have changed the engines or the queue.
    if (fairShare && this.mayHandOver(entry))
      return this.inTurn(async () => {
        const fetchNext = this.mayHandOver(entry);
        if (fetchNext) await fairShare.prepareNext();
        await this.record(entry, outcome, fetchNext);
      });
    return this.record(entry, outcome, this.mayHandOver(entry));
  }

  private mayHandOver(entry: InflightJob): boolean {
    return mayHandOver(entry, {
      engines: this.deps.engines,
      policy: this.deps.policy,
      now: this.deps.now(),
      loopWaiting: this.waitingForMarker,
      promotedPending: this.deps.holding.held.promoted !== undefined,
      mayTake: this.deps.mayTake(),
    });
  }

  /** Records the outcome in BullMQ, fetching the next job with `fetchNext`, then frees the slot. */
  private async record(entry: InflightJob, outcome: RunOutcome, fetchNext: boolean) {
    let next = await recordOutcome(this.deps.worker, entry, outcome, fetchNext);
    if (fetchNext) {
      this.handoverAnsweredAt = this.deps.now();
      this.deps.answered?.();
    }
    if (fetchNext) this.deps.fairShare?.taken(next?.id, false);
    // The lease went while BullMQ answered: the job goes back for the next leader, before
    // the slot is freed, so closing waits for the move (the ledger is not idle yet).
    if (next && !this.deps.mayTake()) {
      await next.moveToWait(entry.token).catch(() => {});
      next = undefined;
    }
    this.free(entry, next);
  }

  /** Frees `entry`'s slot and places the job handed over to it, in the same turn. */
  private free(entry: InflightJob, next: Job | undefined): void {
    const { ledger, fairShare, metrics, pool } = this.deps;
    if (ledger.complete(entry)) fairShare?.ended(entry.payload);
    if (!next) return;
    metrics.handovers.inc({ pool: pool.name });
    markStage('dispatcher.job');
    this.place(next, entry.token);
  }

  /** Why the gate is closed, as the first engine's decision says. */
  private closedReason(): string {
    const decision = gateDecision(this.deps.engines[0]!, this.deps.policy, this.deps.now());
    return decision.admit ? 'unknown' : decision.reason;
  }
}
