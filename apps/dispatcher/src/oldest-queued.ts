// When the pool's oldest queued (not yet released) job was added, held ones included, read
// in one script per stats tick without walking the queue. BullMQ keeps the candidates at
// known places (its Lua in node_modules/bullmq/dist/esm/commands):
// - the wait list takes new jobs at its head (LPUSH) and gives them from its tail; a job put
//   at the front (a promoted held job, a fair-share pick: priority 0, lifo) is pushed at the
//   tail. Both ends are read.
// - the prioritized set scores a job priority * 2^32 + a per-add counter, so within a
//   priority band its first member is the first added (a job moved back to wait gets counter
//   0: the front of its band, and it is older anyway). The script reads the first member of
//   each non-empty band, jumping from band to band: at most one read per band in use, bounded
//   by the priority classes (3 per Sluice priority) and by the queue's depth bound.
// - the delayed set (long prompts the leader holds back) is ordered by the time each is due
//   back, its deadline plus a fixed grace: with one park limit per pool, the first due is the
//   first queued.
// The age is read from each candidate's BullMQ `timestamp` (set once, at the add, by the
// gateway's clock). A job that was put back from active (a lease lost mid-take) keeps its
// timestamp but may hide behind a younger band head: the age then reads low for as long.
import type { KeySpace } from '@sluice/protocol';
import type { Redis } from '@sluice/redis';

// KEYS: wait, prioritized, delayed. ARGV: job key prefix. Answers the oldest add time, ms.
const script = `local oldest = false
local function consider(id)
  if not id then return end
  local ts = tonumber(redis.call('hget', ARGV[1] .. id, 'timestamp'))
  if ts and (not oldest or ts < oldest) then oldest = ts end
end
consider(redis.call('lindex', KEYS[1], -1))
consider(redis.call('lindex', KEYS[1], 0))
local band = 4294967296
local from = '-inf'
while true do
  local head = redis.call('zrangebyscore', KEYS[2], from, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
  if #head == 0 then break end
  consider(head[1])
  from = string.format('%.0f', (math.floor(tonumber(head[2]) / band) + 1) * band)
end
consider(redis.call('zrange', KEYS[3], 0, 0)[1])
return oldest`;

/** Unix ms at which the pool's oldest queued job was added; undefined when none is queued. */
export async function oldestQueuedAt(
  redis: Redis,
  keys: KeySpace,
  pool: string,
): Promise<number | undefined> {
  // Every key the script touches carries the pool's hash tag: one slot on a Cluster.
  const at = await redis.eval(
    script,
    3,
    keys.queueKey(pool, 'wait'),
    keys.queueKey(pool, 'prioritized'),
    keys.queueKey(pool, 'delayed'),
    keys.jobKey(pool, ''),
  );
  return typeof at === 'number' ? at : undefined;
}
