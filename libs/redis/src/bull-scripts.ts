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
}

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
  return `${QUIET_MARK}
local redis = (function(real)
  local call = real.call
  local function quietCall(command, ...)
    if command == 'XADD' then return '0-0' end
    if command == 'XTRIM' then return 0 end
    if command == 'HGET' then
      local _, field = ...
      if field == 'opts.maxLenEvents' then return '0' end
    end${idCounter}
    return call(command, ...)
  end
  return setmetatable({ call = quietCall }, { __index = real })
end)(redis)
${bullLua}`;
}

/** The scripts BullMQ's worker runs for every job: the take and the completion (with the next take). */
const WORKER_JOB_SCRIPTS = ['moveToActive', 'moveToFinished'] as const;

/**
 * Redefines BullMQ's take and completion on `conn` without the events stream, under BullMQ's
 * own names, so the worker runs them unchanged otherwise. Call once BullMQ has loaded its
 * scripts on `conn`; a second call changes nothing.
 */
export function quietWorkerScripts(conn: Redis): void {
  for (const base of WORKER_JOB_SCRIPTS) {
    const script = bullScript(conn, base);
    if (script.lua.startsWith(QUIET_MARK)) continue;
    conn.defineCommand(script.name, {
      numberOfKeys: script.numberOfKeys,
      lua: withoutEventsStream(script.lua),
    });
  }
}
