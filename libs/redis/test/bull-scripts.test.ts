// BullMQ's scripts without the events stream, on a real redis-server: the Lua in front answers
// the stream's commands and runs every other one. Stand-in scripts written as BullMQ writes
// its own (`local rcall = redis.call`, upper-case command names); BullMQ's real take and
// completion are run quieted in apps/dispatcher/test/quiet-scripts.test.ts.
import { describe, expect, it } from 'vitest';
import {
  bullScript,
  createRedis,
  quietWorkerScripts,
  redisReady,
  scriptCommand,
  withoutEventsStream,
} from '../src/index.ts';
import { withMarkerRearm } from '../src/marker-rearm.ts';
import { withWaitingCount } from '../src/take-count.ts';
import { useScriptRedis } from './script-redis.ts';

const db = useScriptRedis('bull-scripts');

// What BullMQ's job scripts do with the stream, the id counter and everything else.
const standIn = `local rcall = redis.call
local maxEvents = rcall("HGET", KEYS[2], "opts.maxLenEvents")
if not maxEvents then
  maxEvents = 10000
  rcall("HSET", KEYS[2], "opts.maxLenEvents", maxEvents)
end
local jobCounter = rcall("INCR", KEYS[3])
rcall("XADD", KEYS[1], "MAXLEN", "~", maxEvents, "*", "event", "added", "jobId", ARGV[1])
rcall("XTRIM", KEYS[1], "MAXLEN", "~", maxEvents)
local prio = rcall("INCR", KEYS[4])
rcall("HSET", KEYS[5], "id", ARGV[1])
return {tostring(maxEvents), jobCounter, prio, redis.sha1hex("x"), rcall("HGET", KEYS[5], "id")}
`;
const keys = ['q:events', 'q:meta', 'q:id', 'q:pc', 'q:job'];

async function run(lua: string): Promise<unknown> {
  return db.redis.eval(lua, keys.length, ...keys, 'job-1');
}

describe("BullMQ's scripts without the events stream", () => {
  it('as BullMQ runs them, the stream, its length and the id counter are written', async () => {
    expect(await run(standIn)).toEqual(['10000', 1, 1, expect.any(String), 'job-1']);
    expect(await db.redis.exists('q:events', 'q:id')).toBe(2);
    expect(await db.redis.hget('q:meta', 'opts.maxLenEvents')).toBe('10000');
  });

  it('quieted, writes no stream and no stream length, and runs every other command', async () => {
    const [maxEvents, , prio, sha, id] = (await run(withoutEventsStream(standIn))) as unknown[];
    expect([maxEvents, prio, id]).toEqual(['0', 1, 'job-1']);
    // The rest of `redis` is the real one.
    expect(sha).toBe('11f6ad8ec52a2984abaafd7c3b516503785c2072');
    expect(await db.redis.exists('q:events', 'q:meta')).toBe(0);
    expect(await db.redis.hget('q:job', 'id')).toBe('job-1');
    // Without `ownJobId`, the id counter is BullMQ's as before (a job scheduler's next id).
    expect(await db.redis.get('q:id')).toBe('1');
  });

  it('with ownJobId, skips the id counter, and only it: the priority counter counts', async () => {
    const reply = (await run(withoutEventsStream(standIn, { ownJobId: true }))) as unknown[];
    expect(reply.slice(1, 3)).toEqual([0, 1]);
    expect(await db.redis.exists('q:id')).toBe(0);
    expect(await db.redis.get('q:pc')).toBe('1');
  });

  it('finds a script by its name with or without the version, and names one it cannot find', () => {
    db.redis.defineCommand('moveToActive:9.9.9', { numberOfKeys: 5, lua: standIn });
    expect(bullScript(db.redis, 'moveToActive')).toEqual({
      name: 'moveToActive:9.9.9',
      lua: standIn,
      numberOfKeys: 5,
    });
    expect(bullScript(db.redis, 'moveToActive:9.9.9').name).toBe('moveToActive:9.9.9');
    expect(() => bullScript(db.redis, 'moveToActive:1.0.0')).toThrow(
      /moveToActive:1.0.0 is not defined/,
    );
  });

  it('redefines the take, the completion and the hold under their names, once however often called', async () => {
    const other = createRedis(db.url, { name: 'bull-scripts-2', role: 'bullmq' });
    // The take's header names the keys its count of waiting jobs reads (take-count.ts), the
    // completion's and the hold's those the marker's re-arming reads (marker-rearm.ts).
    const takeStandIn = `--[[ KEYS[1] wait key, KEYS[4] prioritized key, KEYS[2] marker key ]]\n${standIn}`;
    const moveStandIn = `--[[ KEYS[1] wait key, KEYS[2] active key, KEYS[3] prioritized key,
  KEYS[4] meta key, KEYS[5] marker key ]]\n${standIn}`;
    const moves = ['moveToFinished', 'moveToDelayed'];
    try {
      await redisReady(other);
      other.defineCommand('moveToActive:9.9.9', { numberOfKeys: 5, lua: takeStandIn });
      expect(() => quietWorkerScripts(other)).toThrow(/moveToFinished is not defined/);
      for (const move of moves)
        other.defineCommand(`${move}:9.9.9`, { numberOfKeys: 5, lua: moveStandIn });
      quietWorkerScripts(other);
      quietWorkerScripts(other);
      expect(bullScript(other, 'moveToActive:9.9.9').lua).toBe(
        withoutEventsStream(withWaitingCount(takeStandIn), { soundJobHash: true }),
      );
      for (const move of moves)
        expect(bullScript(other, `${move}:9.9.9`).lua).toBe(
          withoutEventsStream(withMarkerRearm(moveStandIn, move), { soundJobHash: true }),
        );
      for (const name of ['moveToActive', ...moves])
        await scriptCommand(other, `${name}:9.9.9`)!.call(other, ...keys, 'job-2');
      expect(await db.redis.exists('q:events')).toBe(0);
      expect(await db.redis.get('q:pc')).toBe('3');
    } finally {
      await other.quit();
    }
  });
});

// What the take returns to the worker: the job hash, read whole (BullMQ's
// prepareJobForProcessing ends with `HGETALL` of the job key).
const take = `local rcall = redis.call
rcall("HSET", KEYS[1], "processedOn", "1")
return {rcall("HGETALL", KEYS[1]), ARGV[1]}
`;

describe('a job hash made sound before the worker reads it', () => {
  const sound = withoutEventsStream(take, { soundJobHash: true });
  const jobKey = 'q:job-7';
  const hashOf = (reply: unknown) => {
    const flat = (reply as [string[], string])[0];
    return Object.fromEntries(flat.flatMap((v, i) => (i % 2 ? [] : [[v, flat[i + 1]]])));
  };

  it('returns a sound hash as it is, and writes nothing', async () => {
    await db.redis.hset(jobKey, { data: '{"v":1}', opts: '{"attempts":1}', progress: '12' });
    const reply = await db.redis.eval(sound, 1, jobKey, 'job-7');
    expect(hashOf(reply)).toEqual({
      data: '{"v":1}',
      opts: '{"attempts":1}',
      progress: '12',
      processedOn: '1',
    });
  });

  it.each([
    ['opts', { opts: '{}' }],
    ['progress', { progress: '0' }],
    ['parent', {}],
  ])(
    'sets a %s that is not JSON sound, and replaces the data by what was wrong',
    async (field, fixed) => {
      await db.redis.hset(jobKey, { data: '{"v":1}', opts: '{"attempts":1}', [field]: '{"cut' });
      const expected = {
        opts: '{"attempts":1}',
        ...fixed,
        data: `"the job field ${field} is not JSON"`,
        processedOn: '1',
      };
      expect(hashOf(await db.redis.eval(sound, 1, jobKey, 'job-7'))).toEqual(expected);
      // In Redis too: the completion, which decodes `parent` in Lua, and the next reader see it.
      expect(await db.redis.hgetall(jobKey)).toEqual(expected);
    },
  );

  it('leaves a job hash as it is where the option is off (the add)', async () => {
    await db.redis.hset(jobKey, { data: '{"v":1}', opts: '{"cut' });
    await db.redis.eval(withoutEventsStream(take), 1, jobKey, 'job-7');
    expect(await db.redis.hget(jobKey, 'opts')).toBe('{"cut');
  });
});
