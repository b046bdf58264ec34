// How many jobs wait in a pool's queue, and the flags that decide how BullMQ's worker starts
// its next take.
//
// BullMQ's marker (a sorted set that wakes a blocked take) says "look", not "there is a job":
// every take that gets a job sets it again (prepareJobForProcessing.lua,
// `addBaseMarkerIfNeeded`). So a worker that took the last job tries a non-blocking
// `moveToActive` that finds nothing, then blocks on the marker, which answers at once (the
// take set it), and tries another `moveToActive` that finds nothing. The release loop learns
// what its take left waiting from the take's own reply (libs/redis take-count.ts, which clears
// the marker in the same script) and marks the worker drained here, so the next take blocks at
// once (docs/performance.md, "Empty takes" and "The take counts what it leaves"). The probe
// below counts the same on a connection of its own, for the take watchdog, which must not ask
// BullMQ's connection (the one it suspects hung): the wait list and the prioritised set, and
// when both are empty it removes the base marker in the same script, so a job added after it
// sets the marker again and a job added before it is counted.
import type { Redis } from '@sluice/redis';
import type { QueueBase, Worker } from 'bullmq';

// KEYS: wait list, prioritised set, marker. BullMQ's base marker is member "0"
// (addBaseMarkerIfNeeded.lua); a held job's marker ("1", scored with its time) stays.
const probeLua = `local n = redis.call('llen', KEYS[1]) + redis.call('zcard', KEYS[2])
if n == 0 then redis.call('zrem', KEYS[3], '0') end
return n`;

const COMMAND = 'sluiceQueueProbe';

type Probing = Redis & Record<string, unknown>;

/**
 * Makes `worker`'s next blocking take wait on the marker first, as after a take that found
 * nothing: BullMQ's Worker blocks only while `drained` (worker.js `_getNextJob`) and otherwise
 * goes straight to `moveToActive`. Should a BullMQ update rename the flag, the next take finds
 * the queue empty as before (one empty script) and blocks then: slower, never wrong. The unit
 * test pins that the take blocks first.
 */
export function markDrained(worker: Worker): void {
  (worker as unknown as { drained: boolean }).drained = true;
}

/**
 * Lets `worker`'s next blocking take wait on the marker again after the release loop abandoned
 * a take hung in that wait (take-watchdog.ts): BullMQ blocks only while no wait of its own is
 * out (worker.js `_getNextJob`, `this.waiting`), and goes straight to `moveToActive` otherwise,
 * so every take would find the queue empty at once and the loop would spin. The hung wait
 * clears the flag itself should it ever end. Should a BullMQ update rename the flag, the unit
 * test that pins an abandoned take's successor blocking fails.
 */
export function forgetWait(worker: Worker): void {
  (worker as unknown as { waiting: unknown }).waiting = null;
}

/**
 * Answers how many jobs wait in `queue` (held ones not counted), clearing BullMQ's wake-up
 * marker when none does. Defined on `conn` (BullMQ's connection) once.
 */
export function queueProbe(conn: Redis, queue: QueueBase): () => Promise<number> {
  const probing = conn as Probing;
  if (typeof probing[COMMAND] !== 'function')
    conn.defineCommand(COMMAND, { numberOfKeys: 3, lua: probeLua });
  const { wait, prioritized, marker } = queue.keys;
  const send = probing[COMMAND] as (...args: string[]) => Promise<unknown>;
  return async () => {
    const n = await send.call(conn, wait!, prioritized!, marker!);
    if (typeof n !== 'number') throw new Error(`the queue probe answered ${JSON.stringify(n)}`);
    return n;
  };
}
