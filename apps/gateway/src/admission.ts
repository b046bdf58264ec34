// Admission to a pool's queue in one script: Sluice's checks (drain, the depth bound, the
// tenant's bound) run in front of BullMQ's own add, unchanged, in the same EVALSHA. Redis runs
// a script whole, so nothing comes between the count and the add, for clients and for anyone
// reading the queue, on a single Redis and on a Cluster alike (every key carries the pool's
// hash tag). A refusal adds nothing and leaves nothing behind.
//
// BullMQ still builds its keys and packs its arguments: the job's add is run against a
// recorder that keeps what BullMQ would send (`Job.addJob` calls `runCommand(name, args)` on
// the client it is given, bullmq/src/classes/redis-queue-backend.ts `addJobToTransaction`),
// and the script BullMQ registered under that name is wrapped once per connection. Before,
// the check and the add ran as MULTI, EVAL, EVALSHA, EXEC: three more commands per request,
// and a placeholder key to make the add a no-op after a refusal. BullMQ's add runs without
// its events stream and, every job having an id of its own, without the id counter
// (`withoutEventsStream`, libs/redis: four commands fewer per request).
import {
  bullScript,
  scriptCommand,
  withoutEventsStream,
  type Redis,
  type ScriptCommand,
} from '@sluice/redis';
import type { Job } from 'bullmq';

/** What the admission script answers: the queue's depth before the add, or a refusal code. */
export const ADMISSION_CODES = {
  queueFull: -1,
  tenantQueueFull: -2,
  poolDraining: -3,
} as const;

/** The keys and arguments Sluice's checks read, after BullMQ's own. */
export interface AdmissionInput {
  /**
   * Wait list, prioritised set, held (delayed) set, control key, the job's body key, then the
   * tenant's set if any.
   */
  keys: string[];
  /**
   * Depth bound, tenant bound (0: none), priority, job key prefix, job id, then, for a body in
   * a key of its own (`bodyInKey`), the raw body and the key's time to live in ms.
   */
  args: Array<string | number | Buffer>;
}

/**
 * Members of a tenant's set checked for a job that is gone before the tenant is refused: the
 * first ones, those its next jobs are. Every job that leaves the queue has its member removed
 * (the gateway's `removeQueued`, the leader's release, expiry or discard); a member stays only
 * when that removal failed (a Redis blip, a dispatcher that died), and the set is served from
 * its front, so that is where such members collect. The leader's reading script
 * (apps/dispatcher tenant-queues.ts) drops them too, at every pick, up to a tenant's second
 * waiting job; one further back comes to the front as the jobs before it go. Checking the
 * whole set instead cost an EXISTS per queued job on every refusal: 3.2 ms of Redis at 5,000
 * queued, for each retry of a client that loops on its 429s.
 */
export const TENANT_STALE_CHECKS = 8;

// KEYS and ARGV past BullMQ's own (K keys, A arguments) are Sluice's. The tenant's set holds
// the jobs it has queued; before a tenant refusal, the first TENANT_STALE_CHECKS members are
// checked and those whose job is gone dropped, until the tenant is under its bound. A member
// counts until dropped, so no more than the bound of live jobs is ever admitted; a job that is
// gone and not yet dropped can only make a refusal early, never an admission late.
const checks = (k: number, a: number): string => `local sluiceQueued
local K, A = ${k}, ${a}
do
  if redis.call('get', KEYS[K + 4]) == 'draining' then return {${ADMISSION_CODES.poolDraining}} end
  local n = redis.call('llen', KEYS[K + 1]) + redis.call('zcard', KEYS[K + 2]) + redis.call('zcard', KEYS[K + 3])
  if n >= tonumber(ARGV[A + 1]) then return {${ADMISSION_CODES.queueFull}} end
  local tenantSet = KEYS[K + 6]
  if tenantSet then
    local bound = tonumber(ARGV[A + 2])
    local queued = bound > 0 and redis.call('zcard', tenantSet) or 0
    if bound > 0 and queued >= bound then
      for _, id in ipairs(redis.call('zrange', tenantSet, 0, ${TENANT_STALE_CHECKS - 1})) do
        if redis.call('exists', ARGV[A + 4] .. id) == 0 then
          redis.call('zrem', tenantSet, id)
          queued = queued - 1
          if queued < bound then break end
        end
      end
      if queued >= bound then return {${ADMISSION_CODES.tenantQueueFull}} end
    end
    redis.call('zadd', tenantSet, ARGV[A + 3], ARGV[A + 5])
  end
  sluiceQueued = n
end
`;

/**
 * BullMQ's script text as a function of its own, so its `return` ends only the add (and its
 * `redis` without the events stream stays inside it); a raw body then goes into its own key,
 * which the dispatcher reads and deletes and which expires.
 */
export function composeAdmission(bullLua: string, bullKeys: number, bullArgs: number): string {
  return `${checks(bullKeys, bullArgs)}local function bullmqAdd()
${withoutEventsStream(bullLua, { ownJobId: true })}
end
local added = bullmqAdd()
if ARGV[A + 6] and type(added) == 'string' then
  redis.call('set', KEYS[K + 5], ARGV[A + 6], 'PX', ARGV[A + 7])
end
return {sluiceQueued, added}
`;
}

/** The command BullMQ's add would run, as recorded. */
interface RecordedAdd {
  name: string;
  args: unknown[];
}

/** Runs BullMQ's add of `job` against a recorder and answers the script it would have run. */
async function recordAdd(job: Job): Promise<RecordedAdd> {
  let recorded: RecordedAdd | undefined;
  const recorder = {
    runCommand(name: string, args: unknown[]) {
      recorded = { name, args };
      return Promise.resolve(job.id);
    },
  };
  await job.addJob(recorder as never);
  if (!recorded) throw new Error('BullMQ added the job without running a script');
  return recorded;
}

/** Defines (once per connection) the admission command around BullMQ's script `bullName`. */
function admissionCommand(
  conn: Redis,
  bullName: string,
  argCount: number,
): [ScriptCommand, number] {
  const bull = bullScript(conn, bullName);
  const name = `sluiceAdmit_${bull.name}`;
  let command = scriptCommand(conn, name);
  if (!command) {
    conn.defineCommand(name, {
      lua: composeAdmission(bull.lua, bull.numberOfKeys, argCount - bull.numberOfKeys),
    });
    command = scriptCommand(conn, name)!;
  }
  return [command, bull.numberOfKeys];
}

/**
 * Admits and adds `job` in one script on BullMQ's connection `conn`. Answers the queue's depth
 * before the add (>= 0) or one of ADMISSION_CODES. ioredis resends the script after a
 * `SCRIPT FLUSH` (NOSCRIPT), so no retry is needed here.
 */
export async function admitAndAdd(conn: Redis, job: Job, input: AdmissionInput): Promise<number> {
  // The add skips the queue's id counter: a job without an id of its own would get id 0.
  if (!job.id) throw new Error('admitAndAdd needs a job with an id of its own');
  const bull = await recordAdd(job);
  const [command, bullKeys] = admissionCommand(conn, bull.name, bull.args.length);
  const reply = await command.call(
    conn,
    bullKeys + input.keys.length,
    ...bull.args.slice(0, bullKeys),
    ...input.keys,
    ...bull.args.slice(bullKeys),
    ...input.args,
  );
  if (!Array.isArray(reply) || typeof reply[0] !== 'number')
    throw new Error(`the admission script answered ${JSON.stringify(reply)}`);
  const [queued, added] = reply as [number, unknown];
  if (queued >= 0 && typeof added === 'number' && added < 0)
    throw new Error(`BullMQ's add refused job ${String(job.id)} with code ${added}`);
  return queued;
}
