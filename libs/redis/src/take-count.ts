// BullMQ's take (`moveToActive`) as the dispatcher runs it also says whether it left jobs
// waiting, in its own reply, and clears BullMQ's wake-up marker when it left none.
//
// Why: the marker says "look", not "there is a job". A take that gets a job sets it again
// (prepareJobForProcessing.lua, `addBaseMarkerIfNeeded`), so a worker that took the last job
// would try an empty take, block on a marker that answers at once, and try another. The
// release loop used to find out with a probe script after the take: one more round trip per
// request whenever the queue ran dry, which is every request at low load (docs/performance.md,
// "The take counts what it leaves"). Counted inside the take's own script, Redis runs the
// count and the take whole: a job added before it is counted, one added after it sets the
// marker again, so no job loses its wake-up. A held job's marker (member `1`, scored with its
// time) stays. What is counted is how many of the wait list and the prioritised set hold jobs,
// one EXISTS (Redis deletes an empty list or set): the loop only asks whether it is 0, and
// every command in the take is one more per request on Redis's side.
import type { ScriptCommand } from './bull-scripts.js';
import type { Redis } from './connect.js';
import { headerKeys } from './script-header.js';

/** Where BullMQ's moveToActive takes the keys the count reads (1-based, as Lua's KEYS). */
export interface TakeKeys {
  wait: number;
  prioritized: number;
  marker: number;
}

/**
 * The KEYS index of each key the count reads, from the header of BullMQ's moveToActive.
 * Throws naming the key when an update of BullMQ no longer documents one: the dispatcher stops
 * at start-up rather than count the wrong list.
 */
export function takeKeys(bullLua: string): TakeKeys {
  const keys = headerKeys(bullLua, ['wait key', 'prioritized key', 'marker key'], 'moveToActive');
  return {
    wait: keys['wait key'],
    prioritized: keys['prioritized key'],
    marker: keys['marker key'],
  };
}

/** The reply's element the count is put in: BullMQ's own four come first. */
const COUNT_AT = 5;

/**
 * `bullLua` (BullMQ's moveToActive) run as a function, its reply given, as a fifth element,
 * how many of the wait list and the prioritised set still hold jobs (0: no job waits), with
 * the base marker removed when that is 0. BullMQ reads the first four elements only
 * (redis-queue-backend.js `raw2NextJobData`).
 */
export function withWaitingCount(bullLua: string, keys: TakeKeys = takeKeys(bullLua)): string {
  return `local sluiceTaken = (function()
${bullLua}
end)()
if type(sluiceTaken) == 'table' and #sluiceTaken == ${COUNT_AT - 1} then
  local waiting = redis.call('EXISTS', KEYS[${keys.wait}], KEYS[${keys.prioritized}])
  if waiting == 0 then redis.call('ZREM', KEYS[${keys.marker}], '0') end
  sluiceTaken[${COUNT_AT}] = waiting
end
return sluiceTaken`;
}

/** The last count each queue's take answered, by wait key, per connection. */
const counts = new WeakMap<Redis, Map<string, number>>();

/**
 * `take` (moveToActive as defined on `conn`, with `withWaitingCount`), keeping the count of
 * each reply for `waitingAfterTake`. BullMQ calls the command with one array of keys then
 * arguments (redis-queue-backend.js `execCommand`).
 */
export function countingTake(conn: Redis, take: ScriptCommand, keys: TakeKeys): ScriptCommand {
  const byQueue = new Map<string, number>();
  counts.set(conn, byQueue);
  return function (this: Redis, ...args: unknown[]) {
    const flat = Array.isArray(args[0]) ? (args[0] as unknown[]) : args;
    const waitKey = String(flat[keys.wait - 1]);
    return take.apply(this, args).then((reply) => {
      const waiting = Array.isArray(reply) ? reply[COUNT_AT - 1] : undefined;
      if (typeof waiting === 'number') byQueue.set(waitKey, waiting);
      else byQueue.delete(waitKey);
      return reply;
    });
  };
}

/**
 * What the last take from the queue of `waitKey` on `conn` left waiting, once (forgotten as it
 * is read): 0 when no job waits, else how many of the wait list and the prioritised set hold
 * jobs. Undefined when no counted take answered since (the take failed, or ran without
 * `countingTake`).
 */
export function waitingAfterTake(conn: Redis, waitKey: string): number | undefined {
  const byQueue = counts.get(conn);
  const waiting = byQueue?.get(waitKey);
  byQueue?.delete(waitKey);
  return waiting;
}
