// The end of a run, recorded in BullMQ, and the slot's handover: when the release order would
// take BullMQ's next job anyway and the gate still admits once this job's slot is free, the
// same `moveToFinished` script that completes the job takes the next one (`fetchNext`), with
// its lock and BullMQ's global concurrency checked in Redis. The slot stays counted by the
// ledger until the script answered, so the cap is exact without a take in between.
import { pickEngine, type GatePolicy } from '@sluice/admission';
import type { Job, Worker } from 'bullmq';
import type { EngineSlot } from './engine-slot.js';
import { buildJob } from './job-build.js';
import { sequencesOf, type InflightJob } from './ledger.js';

/** How a run ended, as BullMQ records it: `ok` completes the job, anything else fails it. */
export type RunOutcome = 'ok' | (string & {});

export interface HandoverView {
  engines: readonly EngineSlot[];
  policy: GatePolicy;
  now: number;
  /** The release loop waits for BullMQ's marker: it gets the next job itself. */
  loopWaiting: boolean;
  /** A held job was promoted: it goes first, and BullMQ's next may not be it. */
  promotedPending: boolean;
  mayTake: boolean;
}

/**
 * Whether the run of `ending` may hand its slot straight to BullMQ's next job: only where the
 * loop would take that very job next (no promoted held job; with tenants, the fair share puts
 * its pick in front first, as before a take) and the gate, with `ending`'s slot free, admits
 * on some engine. The job taken still goes through the release order (`place`), which may
 * hold it back like any other.
 */
export function mayHandOver(ending: InflightJob, view: HandoverView): boolean {
  if (!view.mayTake || view.loopWaiting || view.promotedPending) return false;
  const freed = view.engines.map((e) =>
    e === ending.engine ? { ...e, inflight: e.inflight - sequencesOf(ending.payload) } : e,
  );
  return pickEngine(freed, view.policy, view.now) !== -1;
}

/**
 * Records `outcome` for `entry`'s job and, with `fetchNext`, returns the next job BullMQ moved
 * to active under the same lock token, if there was one. A failed record (the lock was lost,
 * Redis restarted empty) has nothing to hand over: the job is no longer ours.
 */
export async function recordOutcome(
  worker: Worker,
  entry: InflightJob,
  outcome: RunOutcome,
  fetchNext: boolean,
): Promise<Job | undefined> {
  const { job, token } = entry;
  entry.recorded = true;
  let next: unknown;
  try {
    next =
      outcome === 'ok'
        ? await job.moveToCompleted('ok', token, fetchNext)
        : await job.moveToFailed(new Error(outcome), token, fetchNext);
  } catch {
    return undefined;
  }
  // BullMQ answers [jobData, jobId, rateLimitDelay, delayUntil], jobData null when none was
  // free to take (see its moveToFinished-14.lua, fetchNextJob). The job is active already: one
  // whose data does not parse is built all the same, for the release loop to fail it.
  if (!Array.isArray(next) || !next[0] || typeof next[1] !== 'string') return undefined;
  const taken = buildJob(worker, next[0], next[1]);
  taken.token = token;
  return taken;
}
