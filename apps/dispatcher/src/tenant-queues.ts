// The tenants' queued sets of one pool (keys.tenantQueued), as the leader uses them: which
// tenants have a job waiting and which job is each one's next, and moving the job the fair
// share picked to the front of the queue. The choosing is `@sluice/admission`'s
// VirtualTokenCounter; this is the mechanics.
import type { KeySpace } from '@sluice/protocol';
import type { Redis } from '@sluice/redis';
import { Job, type Queue } from 'bullmq';

/** Members read per tenant before giving up on finding a waiting one (held and running ones are skipped). */
const SCAN_LIMIT = 64;

// For each tenant set: its size and its first member that is waiting in BullMQ's queue (in
// the prioritized set, or in the wait list where a move to the front put it). Members held
// back (delayed) or running (active, until the leader's removal lands) are skipped; members
// whose job is gone are dropped (a gateway adds the member and the job in one transaction).
// First of all, the job BullMQ takes next (the wait list's end, else the prioritized set's
// first), so a move to the front is sent only when the pick differs.
// KEYS: prioritized, wait, then one set per tenant. ARGV: job key prefix, limit.
const headsScript = `local out = {}
out[1] = redis.call('lindex', KEYS[2], -1) or redis.call('zrange', KEYS[1], 0, 0)[1] or ''
for i = 3, #KEYS do
  local n = redis.call('zcard', KEYS[i])
  local head = ''
  for _, id in ipairs(redis.call('zrange', KEYS[i], 0, tonumber(ARGV[2]) - 1)) do
    if redis.call('zscore', KEYS[1], id) or redis.call('lpos', KEYS[2], id) then
      head = id
      break
    end
    if redis.call('exists', ARGV[1] .. id) == 0 then
      redis.call('zrem', KEYS[i], id)
      n = n - 1
    end
  end
  out[#out + 1] = n
  out[#out + 1] = head
end
return out`;

/** The tenants' queues and the job BullMQ would take next, in one reading. */
export interface TenantQueuesReading {
  /** The job a take would get now; undefined when nothing waits. */
  next: string | undefined;
  /** Every configured tenant, in configuration order. */
  tenants: TenantQueue[];
}

/** One tenant's queued jobs in the pool: how many (held ones included), and its next waiting one. */
export interface TenantQueue {
  tenant: string;
  queued: number;
  /** The tenant's next job waiting in the queue; undefined when none waits. */
  head: string | undefined;
}

export class TenantQueues {
  private readonly keys: string[];
  private readonly known: ReadonlySet<string>;

  constructor(
    private readonly pool: string,
    private readonly tenants: readonly string[],
    private readonly keySpace: KeySpace,
    private readonly redis: Redis,
    private readonly queue: Queue,
  ) {
    this.known = new Set(tenants);
    this.keys = [
      keySpace.queueKey(pool, 'prioritized'),
      keySpace.queueKey(pool, 'wait'),
      ...tenants.map((t) => keySpace.tenantQueued(pool, t)),
    ];
  }

  async read(): Promise<TenantQueuesReading> {
    const reply = (await this.redis.eval(
      headsScript,
      this.keys.length,
      ...this.keys,
      this.keySpace.jobKey(this.pool, ''),
      SCAN_LIMIT,
    )) as Array<number | string>;
    const next = String(reply[0] ?? '');
    const tenants = this.tenants.map((tenant, i) => {
      const head = String(reply[i * 2 + 2] ?? '');
      return {
        tenant,
        queued: Number(reply[i * 2 + 1] ?? 0),
        head: head === '' ? undefined : head,
      };
    });
    return { next: next === '' ? undefined : next, tenants };
  }

  /**
   * Puts a waiting job at the front of the queue, so the next take is it: BullMQ takes its
   * wait list before the prioritized set, and `lifo` pushes to the end it takes from
   * (changePriority-7.lua). Throws when the job is gone.
   */
  async moveToFront(jobId: string): Promise<void> {
    await new Job(this.queue, 'completion', null, {}, jobId).changePriority({
      priority: 0,
      lifo: true,
    });
  }

  /** The job left its tenant's queue: released, expired or discarded. Failures are left to `read`. */
  remove(tenant: string, jobId: string): void {
    if (!this.known.has(tenant)) return;
    this.redis.zrem(this.keySpace.tenantQueued(this.pool, tenant), jobId).catch(() => {});
  }
}
