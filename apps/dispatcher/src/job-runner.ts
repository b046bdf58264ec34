// Runs one released job: checks its client is still there, registers it for cancellation,
// applies the pool's degradation, calls the engine, relays the answer, and records the
// outcome for the release loop to record (handover.ts). Also the two ways a taken job ends
// without running (skipped, expired).
import { markStage, type DispatcherMetrics } from '@sluice/observability';
import { jobBody, type ErrorInfo, type JobPayload, type KeySpace } from '@sluice/protocol';
import type { Redis } from '@sluice/redis';
import type { Job } from 'bullmq';
import type { CancelBook } from './cancels.js';
import type { PoolLoad } from './degrade.js';
import type { FairShare } from './fair-share.js';
import type { RunOutcome } from './handover.js';
import type { InflightJob } from './ledger.js';
import { OutputTokens } from './output-tokens.js';
import type { RelayHub, ReplyRelay } from './relay.js';
import type { ReplicaLiveness } from './replicas.js';

export interface JobRunnerDeps {
  pool: string;
  keys: KeySpace;
  /** Reads (and deletes) a body carried in a key of its own (`bodyInKey`). */
  redis: Pick<Redis, 'getdelBuffer'>;
  hub: RelayHub;
  cancels: CancelBook;
  replicas: ReplicaLiveness;
  metrics: DispatcherMetrics;
  load: PoolLoad;
  /** The pool's park limit, for the message of a job taken past its deadline. */
  maxParkSeconds: number;
  log: {
    info(o: object, m: string): void;
    warn(o: object, m: string): void;
    error(o: object, m: string): void;
  };
  now: () => number;
  /** A job went to its engine (the drain rate counts these). */
  released: () => void;
  /**
   * The pool's fair share among tenants; absent without tenants. Told when a job goes to its
   * engine (`started`) or is skipped (`notRun`: the release loop's charges come back), charged
   * with a stream's output tokens as they pass, told how a non-streamed job's call ended
   * (`outputEnded`: its reserved output is settled), and given the engine's prompt count when it
   * reports one.
   */
  fairShare?: FairShare;
}

export class JobRunner {
  constructor(private readonly deps: JobRunnerDeps) {}

  /** Fails a taken job without running it; `reason` labels `sluice_skipped_total`. */
  discard(job: Job, token: string, reason: string): Promise<void> {
    this.deps.metrics.skipped.inc({ pool: this.deps.pool, reason });
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
  expire(job: Job, token: string, payload: JobPayload): Promise<void> {
    const message = `no capacity within ${Math.round(this.deps.maxParkSeconds)} s; retry later`;
    return this.refuse(job, token, payload, { code: 'park_timeout', message }, 'past_deadline');
  }

  /**
   * Fails a taken job without running it, its client told why by an error frame; `reason`
   * labels `sluice_skipped_total`.
   */
  async refuse(
    job: Job,
    token: string,
    payload: JobPayload,
    frame: ErrorInfo,
    reason: string,
  ): Promise<void> {
    const { hub, keys } = this.deps;
    try {
      const relay = hub.open(job.id!, keys.replyChannel(payload.replica));
      relay.error(frame);
      hub.close(relay);
      // The frame first, as at the end of a run (runJob).
      await hub.written();
    } catch (err) {
      // Its caller (the loop's take, or a handover inside a run's end) does not wait for this:
      // a throw here would end the process. The job is failed all the same, not left active.
      this.deps.log.error(
        { jobId: job.id, err, code: frame.code },
        'sending an error frame failed',
      );
    }
    return this.discard(job, token, reason);
  }

  /**
   * Runs a job counted in flight by the ledger; never rejects. Resolves with the outcome to
   * record in BullMQ once the reply is written, or undefined when the job needs no record
   * (skipped, which records it itself) or the run failed.
   */
  async run(entry: InflightJob): Promise<RunOutcome | undefined> {
    try {
      return await this.runJob(entry);
    } catch (err) {
      // Nothing above is meant to throw; should something, the process must not die of it.
      this.deps.log.error({ jobId: entry.id, err }, 'job run failed');
      // Thrown before the engine call and before a skip (which gives the charge back itself):
      // the tenant got nothing for its charge. Thrown after it: what the engine generated is
      // unknown, and a non-streamed job's reservation stays charged.
      if (!entry.recorded && entry.callStartedAt === undefined)
        this.deps.fairShare?.notRun(entry.id, entry.payload);
      else this.deps.fairShare?.outputEnded(entry.id, entry.payload, undefined, false);
      return undefined;
    }
  }

  /**
   * Whether the replica holding the job's client is alive. When Redis cannot tell (it is
   * unreachable), the job runs: a blip must not cost a request, and a client that really
   * is gone is noticed by the replica and Redis-loss checks, which cancel the engine request.
   */
  private async replicaAlive(entry: InflightJob): Promise<boolean> {
    try {
      return await this.deps.replicas.isAlive(entry.payload.replica);
    } catch (err) {
      this.deps.log.warn(
        { jobId: entry.id, err: (err as Error).message },
        'replica liveness check failed: running the job',
      );
      return true;
    }
  }

  /**
   * The body a gateway put in a key of its own, read and deleted in one command: from here the
   * job runs or fails, it is never run again (a stalled job is failed). Missing (expired, or
   * deleted outside Sluice) or unreadable, the client gets an error frame and nothing runs.
   */
  private async bodyInKey(entry: InflightJob): Promise<Buffer | undefined> {
    const { hub, keys, pool, log, redis } = this.deps;
    let body: Buffer | null;
    let why: string;
    try {
      body = await redis.getdelBuffer(keys.jobBody(pool, entry.id));
      why = 'is missing from Redis';
    } catch (err) {
      body = null;
      why = `could not be read from Redis: ${(err as Error).message}`;
    }
    if (body) return body;
    log.error({ jobId: entry.id }, `request body ${why}`);
    const relay = hub.open(entry.id, keys.replyChannel(entry.payload.replica));
    relay.error({ code: 'internal_error', message: `request not started: its body ${why}` });
    hub.close(relay);
    await hub.written();
    return undefined;
  }

  private async runJob(entry: InflightJob): Promise<RunOutcome | undefined> {
    const { metrics, hub, cancels, keys, now, log, pool } = this.deps;
    const { job, token, engine, payload, work, id: jobId } = entry;
    const skip = (reason: string) => {
      // A client told nothing (its replica is gone, or it cancelled) finds the job gone: this
      // line is what says why.
      log.info({ jobId, pool, reason }, 'job failed without running');
      entry.recorded = true;
      // The release loop charged the tenant when it let the job go (its input, and a
      // non-streamed job's reserved output); it never reached an engine.
      this.deps.fairShare?.notRun(jobId, payload);
      return this.discard(job, token, reason).then(() => undefined);
    };
    if (!(await this.replicaAlive(entry))) return skip('client_gone');
    const cancellation = cancels.register(jobId);
    let relay: ReplyRelay | undefined;
    let outcome;
    // From the registration on, the job leaves the cancel book however its run ends, a throw
    // included: an entry left there would stay for as long as this process lives.
    try {
      const why = cancellation.reason;
      if (why) {
        // A client that cancelled knows; one whose job this dispatcher lost is told.
        if (why.frameCode !== 'cancelled') {
          const refusal = hub.open(jobId, keys.replyChannel(payload.replica));
          refusal.error({ code: why.frameCode, message: `request not started: ${why.message}` });
          hub.close(refusal);
        }
        return await skip('cancelled');
      }

      const body = payload.bodyInKey ? await this.bodyInKey(entry) : jobBody(payload);
      if (body === undefined) return await skip('body_missing');
      let degraded;
      try {
        degraded = this.deps.load.apply(body, payload.path, payload.optOut === true);
      } catch (err) {
        // The gateway validated the body; should a rewrite still fail, the request goes as sent.
        log.error(
          { jobId, err: (err as Error).message },
          'degradation rewrite failed: sending the body unchanged',
        );
        degraded = { body, state: 'normal', degraded: false };
      }
      if (degraded.degraded) metrics.degraded.inc({ pool, state: degraded.state });
      relay = hub.open(jobId, keys.replyChannel(payload.replica), !payload.stream);
      // Counted for every job: the end frame carries the counts to the gateway's token
      // counters; a fair share (tenants configured) is charged as they come.
      const fairShare = payload.tenant !== undefined ? this.deps.fairShare : undefined;
      metrics.released.inc({ pool, engine: engine.name });
      fairShare?.started(payload);
      this.deps.released();
      relay.start({ engine: engine.name, loadState: degraded.state });
      const tokens = new OutputTokens(payload.stream);
      markStage('dispatcher.engine-call');
      entry.callStartedAt = now();
      outcome = await engine.client.call(
        payload.path,
        degraded.body,
        relay,
        cancellation,
        {
          firstByte: (status) => {
            entry.firstByteAt = now();
            work.firstByte(entry.firstByteAt, status);
          },
          data: fairShare
            ? (chunk) => fairShare.output(payload.tenant, tokens.chunk(chunk))
            : (chunk) => tokens.chunk(chunk),
          end: () => {
            const more = tokens.end();
            if (tokens.ignored)
              log.warn(
                { jobId, pool, engine: engine.name, usage: tokens.ignored },
                'engine usage count is not a token count: ignored',
              );
            // A stream was charged as it passed: the engine's count corrects that. A
            // non-streamed answer's count settles its reservation once the call ended (below).
            if (payload.stream) fairShare?.output(payload.tenant, more);
            const promptTokens = tokens.reported?.promptTokens;
            if (promptTokens !== undefined) fairShare?.inputReported(payload, promptTokens);
            return payload.endCounts === true ? tokens.totals() : undefined;
          },
        },
        payload,
      );
      // However the call ended: a cancel, a time-out or a failure before the whole answer
      // leaves no usage, and the reservation made at release stays charged, unless the engine
      // generated nothing for certain: it refused the request (4xx) or was never reached.
      if (!payload.stream)
        fairShare?.outputEnded(
          jobId,
          payload,
          tokens.reported?.completionTokens,
          outcome === 'client_error' || outcome === 'engine_unreachable',
        );
    } finally {
      cancels.unregister(jobId);
      if (relay) hub.close(relay);
    }
    metrics.completed.inc({ pool, outcome });
    // The reply goes first: the client need not wait while Redis runs BullMQ's completion
    // script (and the next take behind it). Should this process die between the two, the job
    // stays active under a lock nobody renews; the stalled check fails it (maxStalledCount 0),
    // so it never runs twice, and its client already has the whole answer.
    await hub.written();
    // An engine's 4xx was delivered whole like any answer: BullMQ completes the job, as it did
    // before the refusal had an outcome of its own; only the counter tells it apart.
    return outcome === 'client_error' ? 'ok' : outcome;
  }
}
