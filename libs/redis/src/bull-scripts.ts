// BullMQ's Lua scripts as ioredis holds them on a connection BullMQ has loaded: one
// `defineCommand` per script, named `<script>:<version>` (bullmq/src/classes/redis-connection.ts,
// `loadCommands`, which defines a name only where none is defined yet). Sluice composes its
// own commands around them (the admission around the add, the tenant heads around
// changePriority) and runs the ones on every job's path without BullMQ's events stream.
//
// Why without the stream: Sluice never reads it (replies travel on pub/sub, nothing creates a
// QueueEvents), yet BullMQ writes it on every add, take and completion and cannot be told not
// to (with `maxLen: 0` every XADD still runs: bullmq#366, #1625). Those are eight of the 38
// commands BullMQ runs per job (docs/performance.md, "Without the events stream").
import type { Redis } from './connect.js';
import { withMarkerRearm } from './marker-rearm.js';
import { countingTake, takeKeys, withWaitingCount } from './take-count.js';

/** One of BullMQ's scripts as defined on a connection. */
export interface BullScript {
  /** The command's name on the connection, version included. */
  name: string;
  lua: string;
  numberOfKeys: number;
}

interface ScriptDefinition {
  lua: string;
  numberOfKeys?: number | null;
}
type Scripted = Redis & { scriptsSet: Record<string, ScriptDefinition | undefined> };

/**
 * BullMQ's script `name` on `conn`, given with its version (`moveToFinished:6.7.0`, as BullMQ
 * runs it) or without (`moveToFinished`). Throws when BullMQ has not defined it there: await
 * the BullMQ client first (`queue.getBackend().client`).
 */
export function bullScript(conn: Redis, name: string): BullScript {
  const set = (conn as Scripted).scriptsSet;
  const found = name.includes(':') ? name : Object.keys(set).find((n) => n.startsWith(`${name}:`));
  const script = found ? set[found] : undefined;
  if (!found || !script || typeof script.numberOfKeys !== 'number')
    throw new Error(`BullMQ's script ${name} is not defined on this connection`);
  return { name: found, lua: script.lua, numberOfKeys: script.numberOfKeys };
}

/** A script command on a connection: called with the connection as `this`. */
export type ScriptCommand = (this: Redis, ...args: unknown[]) => Promise<unknown>;

/** The command of that name on `conn` (defined by BullMQ or by Sluice), if there is one. */
export function scriptCommand(conn: Redis, name: string): ScriptCommand | undefined {
  const command = (conn as unknown as Record<string, unknown>)[name];
  return typeof command === 'function' ? (command as ScriptCommand) : undefined;
}

const QUIET_MARK = '-- sluice: without the events stream';

export interface QuietOptions {
  /**
   * The job comes with an id of its own: the add's INCR of the queue's id counter (`<queue>:id`),
   * which only an add without an id reads, is skipped too. Only for the add scripts: a job
   * scheduler's next id, in moveToFinished, needs it.
   */
  ownJobId?: boolean;
  /**
   * A job hash read whole (HGETALL, which the take and the handover return to the worker) is
   * made sound first: see SOUND_JOB_HASH. Only for the worker's scripts.
   */
  soundJobHash?: boolean;
}

/**
 * The fields of a job hash BullMQ decodes as JSON when it takes the job (`rawToJobJson` in
 * bullmq's redis-queue-backend.js parses `opts`, `progress` and `parent`; its completion script
 * decodes `parent` again in Lua), with what each becomes when it does not decode: `false`
 * removes it. `data` is not among them: Sluice builds the job from bad data itself
 * (apps/dispatcher/src/job-build.ts).
 *
 * One such field that does not decode made the take throw after the job was active, before any
 * code of Sluice's saw its id: the stalled check put it back and the next take threw again, for
 * good, holding one of the pool's slots. Here, in the same script, the field is set sound and
 * the job's data replaced by a JSON string that says which field was bad; the dispatcher then
 * refuses that data as it refuses any payload that is not an object, and fails the job
 * (`invalid_payload`). The job was unusable either way; now it costs no slot and says why.
 */
const SOUND_JOB_HASH = `
  local JSON_FIELDS = { opts = '{}', progress = '0', parent = false }
  local function soundJob(key, hash)
    local bad
    for i = 1, #hash, 2 do
      local fallback = JSON_FIELDS[hash[i]]
      if fallback ~= nil and not pcall(cjson.decode, hash[i + 1]) then
        bad = hash[i]
        if fallback then call('HSET', key, bad, fallback) else call('HDEL', key, bad) end
      end
    end
    if not bad then return hash end
    call('HSET', key, 'data', cjson.encode('the job field ' .. bad .. ' is not JSON'))
    return call('HGETALL', key)
  end`;

/**
 * `bullLua` with a `redis` of its own in front: its `redis.call` answers the events stream's
 * commands itself (every XADD and XTRIM in BullMQ's job scripts goes to the stream; the
 * stream's length, HGET `opts.maxLenEvents`, reads as 0 so nothing sets it), and runs every
 * other command as it was. BullMQ's scripts start with `local rcall = redis.call`, which then
 * takes this one; everything else of `redis` is the real one.
 */
export function withoutEventsStream(bullLua: string, options: QuietOptions = {}): string {
  const idCounter = options.ownJobId
    ? `
    if command == 'INCR' then
      local key = ...
      if string.sub(key, -3) == ':id' then return 0 end
    end`
    : '';
  const soundJobHash = options.soundJobHash
    ? `
    if command == 'HGETALL' then
      local key = ...
      return soundJob(key, call(command, key))
    end`
    : '';
  return `${QUIET_MARK}
local redis = (function(real)
  local call = real.call${options.soundJobHash ? SOUND_JOB_HASH : ''}
  local function quietCall(command, ...)
    if command == 'XADD' then return '0-0' end
    if command == 'XTRIM' then return 0 end
    if command == 'HGET' then
      local _, field = ...
      if field == 'opts.maxLenEvents' then return '0' end
    end${idCounter}${soundJobHash}
    return call(command, ...)
  end
  return setmetatable({ call = quietCall }, { __index = real })
end)(redis)
${bullLua}`;
}

/** BullMQ's scripts that move a job out of the active list: the completion and the hold. */
const MOVE_SCRIPTS = ['moveToFinished', 'moveToDelayed'] as const;

/** Defines `script` on `conn` again, under its own name, as `lua` without the events stream. */
function redefine(conn: Redis, script: BullScript, lua: string): void {
  conn.defineCommand(script.name, {
    numberOfKeys: script.numberOfKeys,
    lua: withoutEventsStream(lua, { soundJobHash: true }),
  });
}

/**
 * Redefines BullMQ's take, completion and hold on `conn` without the events stream, and with
 * the job hash they return made sound (`soundJobHash`), under BullMQ's own names, so the worker
 * runs them unchanged otherwise. The take also answers whether it left jobs waiting, read with
 * `waitingAfterTake` (take-count.ts); the completion and the hold set the marker again when
 * they leave jobs waiting (marker-rearm.ts). Call once BullMQ has loaded its scripts on `conn`;
 * a second call changes nothing.
 */
export function quietWorkerScripts(conn: Redis): void {
  const take = bullScript(conn, 'moveToActive');
  if (!take.lua.startsWith(QUIET_MARK)) {
    const keys = takeKeys(take.lua);
    redefine(conn, take, withWaitingCount(take.lua, keys));
    // The take's reply is counted on its way to BullMQ (take-count.ts); defined just above.
    const counting = countingTake(conn, scriptCommand(conn, take.name)!, keys);
    (conn as unknown as Record<string, unknown>)[take.name] = counting;
  }
  for (const base of MOVE_SCRIPTS) {
    const script = bullScript(conn, base);
    if (!script.lua.startsWith(QUIET_MARK))
      redefine(conn, script, withMarkerRearm(script.lua, base));
  }
}
