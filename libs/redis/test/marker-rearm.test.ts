// The wake-up marker set again by a move out of the active list, on a real redis-server, with a
// stand-in move written as BullMQ writes its moveToFinished (the header naming its keys, 0 for
// a job moved without a next one, a table for one it took, a negative code for a refusal).
// BullMQ's real completion and hold are run with it in apps/dispatcher/test/quiet-scripts.test.ts.
import { describe, expect, it } from 'vitest';
import { withMarkerRearm } from '../src/marker-rearm.ts';
import { useScriptRedis } from './script-redis.ts';

const db = useScriptRedis('marker-rearm');

const standInMove = `--[[
  Input:
    KEYS[1] active key
    KEYS[2] marker key
    KEYS[3] wait key
    KEYS[4] meta key
    KEYS[5] prioritized key
    ARGV[1] job id
    ARGV[2] fetch next?
]]
local rcall = redis.call
if rcall("LREM", KEYS[1], -1, ARGV[1]) < 1 then return -3 end
if ARGV[2] == "1" then
  local jobId = rcall("RPOPLPUSH", KEYS[3], KEYS[1])
  if jobId then return {{"id", jobId}, jobId, 0, 0} end
end
return 0
`;
const keys = ['q:active', 'q:marker', 'q:wait', 'q:meta', 'q:prioritized'];
const rearming = withMarkerRearm(standInMove, 'moveToFinished');

function move(jobId: string, fetchNext = false): Promise<unknown> {
  return db.redis.eval(rearming, keys.length, ...keys, jobId, fetchNext ? '1' : '0');
}
const marker = () => db.redis.zrange('q:marker', 0, -1, 'WITHSCORES');

describe('the marker set again by a move out of the active list', () => {
  it('is set when the move leaves jobs waiting and the queue below its global concurrency', async () => {
    await db.redis.hset('q:meta', 'concurrency', '1');
    await db.redis.rpush('q:active', 'a');
    await db.redis.rpush('q:wait', 'b');
    expect(await move('a')).toBe(0);
    expect(await marker()).toEqual(['0', '0']);
    // A prioritised job counts as waiting, and a queue without a global concurrency is never full.
    await db.redis.del('q:marker', 'q:wait', 'q:meta');
    await db.redis.rpush('q:active', 'c', 'd');
    await db.redis.zadd('q:prioritized', 1, 'p');
    expect(await move('c')).toBe(0);
    expect(await marker()).toEqual(['0', '0']);
  });

  it('is not set while the queue is still full, paused, or nothing waits', async () => {
    await db.redis.hset('q:meta', 'concurrency', '1');
    await db.redis.rpush('q:active', 'a', 'b');
    await db.redis.rpush('q:wait', 'w');
    expect(await move('a')).toBe(0);
    expect(await marker()).toEqual([]);
    await db.redis.hset('q:meta', 'concurrency', '2', 'paused', '1');
    await db.redis.rpush('q:active', 'c');
    expect(await move('c')).toBe(0);
    expect(await marker()).toEqual([]);
    await db.redis.hdel('q:meta', 'paused');
    await db.redis.del('q:wait');
    expect(await move('b')).toBe(0);
    expect(await marker()).toEqual([]);
  });

  it('is not set when the move took the next job itself or was refused', async () => {
    await db.redis.rpush('q:active', 'a');
    await db.redis.rpush('q:wait', 'c', 'b');
    const reply = (await move('a', true)) as unknown[];
    expect(reply[1]).toBe('b');
    expect(await move('gone')).toBe(-3);
    expect(await marker()).toEqual([]);
  });

  it('names a key the header no longer documents', () => {
    expect(() =>
      withMarkerRearm(standInMove.replace('meta key', 'queue meta'), 'moveToDelayed'),
    ).toThrow("BullMQ's moveToDelayed no longer names its meta key (KEYS[n])");
  });
});
