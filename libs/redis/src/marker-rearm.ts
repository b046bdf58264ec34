// BullMQ's completion (`moveToFinished`) and hold (`moveToDelayed`), as the dispatcher runs
// them, set the queue's wake-up marker again when the job they moved out of the active list
// leaves jobs waiting that no marker announces.
//
// Why: BullMQ sets the marker when a job is added only while the queue is below its global
// concurrency (addBaseMarkerIfNeeded.lua, `isQueuePausedOrMaxed`), and a job leaving the active
// list without taking the next one (`fetchNext` off) sets none. So a job added while every
// slot was held (a job being refused, discarded or held back counts until its move ends)
// waits for a take blocked on the marker to time out: BullMQ's `drainDelay` (1 s) with no
// delayed job, and up to its 10 s ceiling while one is delayed, because the take then blocks
// until that job is due (worker.js `getBlockTimeout`). A held job is a delayed job, so that
// was any pool holding a long prompt back: the short request behind it waited out the take
// (a park timeout at a 10 s limit; e2e/corrupt-job.test.ts found it on a loaded machine).
// Set in the same script as the move, by the same rule BullMQ uses on an add, no job can be
// added between the move and the marker without setting it itself. Whether anything waits is
// one EXISTS of the wait list and the prioritised set (Redis deletes an empty one): the move
// that leaves nothing waiting, every one at low load, costs one command more.
import { headerKeys } from './script-header.js';

const KEY_NAMES = ['wait key', 'active key', 'prioritized key', 'meta key', 'marker key'] as const;

/**
 * `bullLua` (a BullMQ script that moves a job out of the active list and answers 0 when it
 * moved it without taking another) run as a function; when it answers 0, jobs wait in the wait
 * list or the prioritised set, and the queue is neither paused nor at its global concurrency,
 * the base marker is set. `script` names it in the error thrown when its header no longer
 * names a key this reads.
 */
export function withMarkerRearm(bullLua: string, script: string): string {
  const keys = headerKeys(bullLua, KEY_NAMES, script);
  return `local sluiceMoved = (function()
${bullLua}
end)()
if sluiceMoved == 0 and redis.call('EXISTS', KEYS[${keys['wait key']}], KEYS[${keys['prioritized key']}]) > 0 then
  local meta = redis.call('HMGET', KEYS[${keys['meta key']}], 'paused', 'concurrency')
  if not meta[1] and (not meta[2] or redis.call('LLEN', KEYS[${keys['active key']}]) < tonumber(meta[2])) then
    redis.call('ZADD', KEYS[${keys['marker key']}], 0, '0')
  end
end
return sluiceMoved`;
}
