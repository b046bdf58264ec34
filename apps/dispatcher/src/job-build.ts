// Jobs built from what Redis holds without throwing on data that is not JSON. BullMQ parses a
// job's data (`Job.fromJSON`) only after its script made the job active: in a take
// (`moveToActive`, then the worker's `createJob`) and in a handover (`moveToFinished` with
// fetchNext, then handover.ts). A throw there leaves the job active with no id to fail it
// by; the stalled check puts it back and the next take throws again, for good, holding one
// of the pool's slots (BullMQ's global concurrency counts it). Reading the delayed set
// (`getDelayed`) threw for all the jobs when one was bad. Built here, such a job carries its
// raw text as data instead: `validateJobPayload` refuses it as it refuses any payload that is
// not an object, and it is failed like any other invalid payload.
import { Job, Worker, type JobJson } from 'bullmq';

type JobQueue = Parameters<typeof Job.fromJSON>[0];

/** `Job.fromJSON`, but a job whose data does not parse gets the raw text as its data. */
export function buildJob(queue: JobQueue, json: JobJson, jobId?: string): Job {
  try {
    return Job.fromJSON(queue, json, jobId);
  } catch {
    // fromJSON parses `data` first: encoded as a JSON string, it parses to the text itself.
    return Job.fromJSON(queue, { ...json, data: JSON.stringify(json.data) }, jobId);
  }
}

/** A BullMQ worker whose takes build their jobs with `buildJob`. */
export class PoolWorker extends Worker {
  protected override createJob(data: JobJson, jobId: string): Job {
    return buildJob(this, data, jobId);
  }
}
