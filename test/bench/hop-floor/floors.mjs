// The floors' names in Redis, apart from every key of Sluice's, one set per floor so that
// both run beside Sluice on one Redis.
export const floors = {
  /** The hops alone: one LPUSH, one blocking BRPOP, one PUBLISH per request. */
  list: { jobs: 'hop-floor:jobs', replies: 'hop-floor:list-replies' },
  /** The hops and a BullMQ queue set up as Sluice sets up a pool's (bullmq-floor.ts). */
  bullmq: { queue: 'hop-floor-bullmq', replies: 'hop-floor:bullmq-replies' },
};

/** The floor named by a process's argument, or an error that says which ones there are. */
export function floorNamed(name) {
  const floor = floors[name];
  if (!floor) throw new Error(`unknown floor ${JSON.stringify(name)}: list or bullmq`);
  return floor;
}

/** Like Sluice's pool queues: the events stream trimmed, prioritised jobs removed when done. */
export const BULLMQ_JOB_OPTIONS = {
  priority: 5,
  attempts: 1,
  removeOnComplete: true,
  removeOnFail: true,
};
/** The pool's cap in the hop-floor scenario (its ADMISSION_MAX_INFLIGHT). */
export const CONCURRENCY = 64;
