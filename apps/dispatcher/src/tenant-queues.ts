// The tenants' queued sets of one pool (keys.tenantQueued), as the leader uses them: which
// tenants have a job waiting and which job is each one's next, and moving the job the fair
// share picked to the front of the queue. The choosing is `@sluice/admission`'s
// VirtualTokenCounter; this is the mechanics.
//
// The move and the reading for the pick after it go in one script on BullMQ's connection,
// sent just before BullMQ's take on the same connection: Redis runs them in that order, so
// the reading sees the queue as the take will find it, and the job the take answers with
// tells what changed (`afterTake`). A pick-and-take then costs one round trip instead of
// three (read, move, take). The move is BullMQ's own changePriority script, unchanged, as a
// function inside ours (as the gateway's admission wraps BullMQ's add).
import type { KeySpace } from '@sluice/protocol';
import { bullScript, scriptCommand, type Redis, type ScriptCommand } from '@sluice/redis';
import type { Queue } from 'bullmq';

/** Members read per tenant before giving up on finding a waiting one (held and running ones are skipped). */
const SCAN_LIMIT = 64;

// BullMQ's changePriority takes 7 keys (wait, paused, meta, prioritized, active, priority
// counter, marker) and 4 arguments (priority, job key prefix, job id, lifo): see its
// changePriority-7.lua. Ours follow: the tenants' sets; the scan limit and whether to move.
const BULL_KEYS = 7;
const BULL_ARGS = 4;

// After the move, if any: the first two jobs BullMQ takes (its wait list from the right end,
// then the prioritized set), then for each tenant set its size and its first two members that
// are waiting (in the prioritized set, or in the wait list where a move put them). Members
// held back (delayed) or running (active, until the leader's removal lands) are skipped;
// members whose job is gone are dropped (a gateway adds the member and the job in one script).
const readingLua = `local K, A = ${BULL_KEYS}, ${BULL_ARGS}
local moved = ''
if ARGV[A + 2] == '1' then moved = bullmqChangePriority() end
local wait, prioritized, prefix = KEYS[1], KEYS[4], ARGV[2]
local limit = tonumber(ARGV[A + 1])
local order = {}
local w = redis.call('lrange', wait, -2, -1)
for i = #w, 1, -1 do order[#order + 1] = w[i] end
if #order < 2 then
  for _, id in ipairs(redis.call('zrange', prioritized, 0, 1 - #order)) do order[#order + 1] = id end
end
local out = {moved, order[1] or '', order[2] or ''}
for i = K + 1, #KEYS do
  local n = redis.call('zcard', KEYS[i])
  local first, second = '', ''
  for _, id in ipairs(redis.call('zrange', KEYS[i], 0, limit - 1)) do
    if redis.call('zscore', prioritized, id) or redis.call('lpos', wait, id) then
      if first == '' then first = id else
        second = id
        break
      end
    elseif redis.call('exists', prefix .. id) == 0 then
      redis.call('zrem', KEYS[i], id)
      n = n - 1
    end
  end
  out[#out + 1] = n
  out[#out + 1] = first
  out[#out + 1] = second
end
return out`;

/** The tenants' queues and the jobs BullMQ would take next, in one reading. */
export interface TenantQueuesReading {
  /** The job a take would get now; undefined when nothing waits. */
  next: string | undefined;
  /** The job a take would get after `next`; undefined when none, or not known. */
  afterNext: string | undefined;
  /** Every configured tenant, in configuration order. */
  tenants: TenantQueue[];
}

/** One tenant's queued jobs in the pool: how many (held ones included), and its next waiting ones. */
export interface TenantQueue {
  tenant: string;
  queued: number;
  /** The tenant's next job waiting in the queue; undefined when none waits. */
  head: string | undefined;
  /** Its job waiting after `head`; undefined when none, or not known. */
  afterHead: string | undefined;
}

/** A reading, and the outcome of the move sent in the same script. */
export interface MoveAndReading {
  /** Undefined when no move was asked; false when the job was gone. */
  moved: boolean | undefined;
  reading: TenantQueuesReading;
}

/**
 * The queues as a take that answered `taken` left them, from a reading made just before it:
 * `taken` is gone from the front and from its tenant's head. Undefined when the take did not
 * get the reading's next job (something else changed the queue): read again. What a derived
 * reading knows beyond one take is unknown: `afterNext`, and the taken tenant's `afterHead`.
 */
export function afterTake(
  reading: TenantQueuesReading,
  taken: string,
): TenantQueuesReading | undefined {
  if (reading.next !== taken) return undefined;
  return {
    next: reading.afterNext,
    afterNext: undefined,
    tenants: reading.tenants.map((t) =>
      t.head === taken
        ? { ...t, queued: Math.max(0, t.queued - 1), head: t.afterHead, afterHead: undefined }
        : { ...t, afterHead: t.afterHead === taken ? undefined : t.afterHead },
    ),
  };
}

type ChangePriorityArgs = (
  jobId: string,
  priority: number,
  lifo: boolean,
) => Array<string | number>;

export class TenantQueues {
  private readonly tenantKeys: string[];
  private readonly known: ReadonlySet<string>;
  /** The command's name on BullMQ's connection and BullMQ's keys, once defined. */
  private command: { send: ScriptCommand; bullKeys: string[]; prefix: string | number } | undefined;

  constructor(
    private readonly pool: string,
    private readonly tenants: readonly string[],
    private readonly keySpace: KeySpace,
    /** Command connection, for the removals. */
    private readonly redis: Redis,
    /** BullMQ's connection, the one its take runs on. */
    private readonly bull: Redis,
    private readonly queue: Queue,
  ) {
    this.known = new Set(tenants);
    this.tenantKeys = tenants.map((t) => keySpace.tenantQueued(pool, t));
  }

  /**
   * Defines the script on BullMQ's connection once BullMQ has loaded its own there. Await it
   * before `moveAndRead`, which must send without waiting.
   */
  async ready(): Promise<void> {
    if (this.command) return;
    const backend = this.queue.getBackend();
    await backend.client;
    const bull = bullScript(this.bull, 'changePriority');
    if (bull.numberOfKeys !== BULL_KEYS)
      throw new Error(`BullMQ's changePriority takes ${bull.numberOfKeys} keys, not ${BULL_KEYS}`);
    // BullMQ builds the keys and the job key prefix as for its own changePriority.
    const args = (
      backend as unknown as { changePriorityArgs: ChangePriorityArgs }
    ).changePriorityArgs('', 0, true);
    const name = `sluiceTenantHeads_${bull.name}`;
    if (!scriptCommand(this.bull, name))
      this.bull.defineCommand(name, {
        lua: `local function bullmqChangePriority()\n${bull.lua}\nend\n${readingLua}`,
      });
    this.command = {
      send: scriptCommand(this.bull, name)!,
      bullKeys: args.slice(0, BULL_KEYS).map(String),
      prefix: args[BULL_KEYS + 1]!,
    };
  }

  async read(): Promise<TenantQueuesReading> {
    await this.ready();
    return (await this.moveAndRead(undefined)).reading;
  }

  /**
   * Puts `moveJobId` (when given) at the front of the queue, so the next take is it, and reads
   * the queues after the move, in one script sent at once on BullMQ's connection: a take
   * called after this runs after it. BullMQ takes its wait list before the prioritized set, and
   * `lifo` pushes to the end it takes from (changePriority-7.lua). `ready()` must have resolved.
   */
  moveAndRead(moveJobId: string | undefined): Promise<MoveAndReading> {
    const command = this.command;
    if (!command) return Promise.reject(new Error('TenantQueues.moveAndRead before ready()'));
    return command.send
      .call(
        this.bull,
        BULL_KEYS + this.tenantKeys.length,
        ...command.bullKeys,
        ...this.tenantKeys,
        0,
        command.prefix,
        moveJobId ?? '',
        1,
        SCAN_LIMIT,
        moveJobId === undefined ? 0 : 1,
      )
      .then((reply) => this.parse(reply as Array<number | string>));
  }

  /** The job left its tenant's queue: released, expired or discarded. Failures are left to the reading. */
  remove(tenant: string, jobId: string): void {
    if (!this.known.has(tenant)) return;
    this.redis.zrem(this.keySpace.tenantQueued(this.pool, tenant), jobId).catch(() => {});
  }

  private parse(reply: Array<number | string>): MoveAndReading {
    const id = (v: number | string | undefined) =>
      v === undefined || v === '' ? undefined : String(v);
    const moved = reply[0] === '' || reply[0] === undefined ? undefined : Number(reply[0]) === 0;
    const tenants = this.tenants.map((tenant, i) => ({
      tenant,
      queued: Number(reply[3 + i * 3] ?? 0),
      head: id(reply[4 + i * 3]),
      afterHead: id(reply[5 + i * 3]),
    }));
    return { moved, reading: { next: id(reply[1]), afterNext: id(reply[2]), tenants } };
  }
}
