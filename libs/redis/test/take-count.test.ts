// The take's count of what it left waiting, on a real redis-server, with a stand-in take
// written as BullMQ writes its moveToActive (the header naming its keys, `local rcall =
// redis.call`, a reply of four elements). BullMQ's real take is run with it in
// apps/dispatcher/test/quiet-scripts.test.ts.
import { describe, expect, it } from 'vitest';
import {
  bullScript,
  createRedis,
  quietWorkerScripts,
  redisReady,
  waitingAfterTake,
  type Redis,
} from '../src/index.ts';
import { takeKeys, withWaitingCount } from '../src/take-count.ts';
import { useScriptRedis } from './script-redis.ts';

const db = useScriptRedis('take-count');

// Takes from the wait list first, then the prioritised set, sets the base marker again as
// BullMQ's does after every take (addBaseMarkerIfNeeded), and answers as BullMQ's does.
const standInTake = `--[[
  Input:
    KEYS[1] active key
    KEYS[2] wait key
    KEYS[3] marker key
    KEYS[4] prioritized key
]]
local rcall = redis.call
local jobId = rcall("RPOPLPUSH", KEYS[2], KEYS[1])
if not jobId then
  local popped = rcall("ZPOPMIN", KEYS[4])
  jobId = popped[1]
  if jobId then rcall("LPUSH", KEYS[1], jobId) end
end
if jobId then
  rcall("ZADD", KEYS[3], 0, "0")
  return {{"id", jobId}, jobId, 0, 0}
end
return {0, 0, 0, 0}
`;
const keys = ['q:active', 'q:wait', 'q:marker', 'q:prioritized'];
const name = 'moveToActive:9.9.9';

// The completion and the hold the dispatcher redefines with the take: their headers name the
// keys the marker's re-arming reads (marker-rearm.ts); not run here.
const moveStandIn = `--[[ KEYS[1] wait key KEYS[2] active key KEYS[3] prioritized key KEYS[4] meta key
  KEYS[5] marker key ]]
return 0`;

function defineMoveStandIns(conn: Redis): void {
  for (const move of ['moveToFinished:9.9.9', 'moveToDelayed:9.9.9'])
    conn.defineCommand(move, { numberOfKeys: 5, lua: moveStandIn });
}

/** The stand-in defined as BullMQ defines its take, then run as the dispatcher runs it. */
async function quietConnection(): Promise<Redis> {
  const conn = createRedis(db.url, { name: 'take-count-quiet', role: 'bullmq' });
  await redisReady(conn);
  conn.defineCommand(name, { numberOfKeys: keys.length, lua: standInTake });
  defineMoveStandIns(conn);
  quietWorkerScripts(conn);
  return conn;
}

/** A take as BullMQ's worker sends it: one array of keys, then arguments. */
function take(conn: Redis): Promise<unknown> {
  const command = (conn as unknown as Record<string, (args: string[]) => Promise<unknown>>)[name]!;
  return command.call(conn, [...keys, 'prefix']);
}

describe("the take's word on the jobs it left waiting", () => {
  it('finds the keys it reads by the names in the script header, and names one it cannot', () => {
    expect(takeKeys(standInTake)).toEqual({ wait: 2, prioritized: 4, marker: 3 });
    expect(() => takeKeys(standInTake.replace('marker key', 'wake-up key'))).toThrow(
      /no longer names its marker key/,
    );
  });

  it('answers as a fifth element how many of the wait list and the prioritised set hold jobs, and keeps the marker while jobs wait', async () => {
    const conn = await quietConnection();
    try {
      await db.redis.rpush('q:wait', 'c', 'b', 'a');
      const reply = (await take(conn)) as unknown[];
      // Two jobs wait, both in the wait list: one EXISTS answers 1, not a count of jobs.
      expect(reply.slice(1)).toEqual(['a', 0, 0, 1]);
      expect(waitingAfterTake(conn, 'q:wait')).toBe(1);
      // Read once: a second read knows nothing until the next take answers.
      expect(waitingAfterTake(conn, 'q:wait')).toBeUndefined();
      expect(await db.redis.zrange('q:marker', 0, -1)).toEqual(['0']);
      await db.redis.zadd('q:prioritized', 1, 'p');
      await take(conn);
      expect(waitingAfterTake(conn, 'q:wait')).toBe(2);
    } finally {
      await conn.quit();
    }
  });

  it("clears the base marker with the last job, and leaves a held job's", async () => {
    const conn = await quietConnection();
    try {
      await db.redis.zadd('q:prioritized', 1, 'p');
      await db.redis.zadd('q:marker', 1_900_000_000_000, '1');
      expect(((await take(conn)) as unknown[])[1]).toBe('p');
      expect(waitingAfterTake(conn, 'q:wait')).toBe(0);
      expect(await db.redis.zrange('q:marker', 0, -1)).toEqual(['1']);
      // An empty take counts too, and clears a marker an add would have set with no job.
      await db.redis.zadd('q:marker', 0, '0');
      expect(((await take(conn)) as unknown[])[1]).toBe(0);
      expect(waitingAfterTake(conn, 'q:wait')).toBe(0);
      expect(await db.redis.zrange('q:marker', 0, -1)).toEqual(['1']);
    } finally {
      await conn.quit();
    }
  });

  it('leaves a reply that is not four elements as it is, and counts nothing', async () => {
    const conn = createRedis(db.url, { name: 'take-count-other', role: 'bullmq' });
    try {
      await redisReady(conn);
      const odd = standInTake.replace('return {{"id", jobId}, jobId, 0, 0}', 'return {jobId}');
      conn.defineCommand(name, { numberOfKeys: keys.length, lua: odd });
      defineMoveStandIns(conn);
      quietWorkerScripts(conn);
      expect(bullScript(conn, name).lua).toContain(withWaitingCount(odd));
      await db.redis.rpush('q:wait', 'a');
      expect(await take(conn)).toEqual(['a']);
      expect(waitingAfterTake(conn, 'q:wait')).toBeUndefined();
    } finally {
      await conn.quit();
    }
  });
});
