// One leader per pool: a Redis key holding the leader's id with a TTL. The leader renews
// it every ttl/3; a standby tries to take it every min(ttl/3, 250 ms). A renewal that fails
// or finds another owner ends the leadership at once. A standby asks `mayAcquire` before each
// attempt (lease-choice.ts: a dispatcher at SLUICE_MAX_LEASED_POOLS does not contend).
import type { Redis } from '@sluice/redis';

const renewScript = `if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end`;
// Taking the lease also succeeds when it already holds our own id: an earlier attempt that
// timed out on our side may still have reached Redis (ioredis replays commands queued while
// it reconnects), and without this we would wait a whole TTL for our own key to expire.
const acquireScript = `local v = redis.call('get', KEYS[1])
if v == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end
if v then return 0 end
redis.call('set', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1`;
const releaseScript = `if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end`;
// A leader whose renewal ran late may have lost the lease without knowing it yet, while the
// next leader already reads and writes the pool's state: such a write is checked against the
// lease in the same script. Both keys are the pool's (one hash tag), so Redis Cluster runs it.
const hsetWhileHeldScript = `if redis.call('get', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('hset', KEYS[2], unpack(ARGV, 2))
return 1`;

/** Where a pool's lease lives and which dispatcher's it is meant to be. */
export interface LeaseHolder {
  readonly key: string;
  readonly owner: string;
}

/**
 * Sets `fields` of the hash at `key` only while `lease` is still `owner`'s: true when written,
 * false when the lease is someone else's (or no one's) now. Rejects when Redis does.
 */
export async function hsetWhileHeld(
  redis: Redis,
  lease: LeaseHolder,
  key: string,
  fields: Record<string, string | number>,
): Promise<boolean> {
  const args = Object.entries(fields).flatMap(([field, value]) => [field, String(value)]);
  const written = await redis.eval(hsetWhileHeldScript, 2, lease.key, key, lease.owner, ...args);
  return written === 1;
}

export interface LeaseEvents {
  acquired(): void;
  lost(): void;
}

export interface LeaseOptions {
  /** Asked before each attempt to take the lease; false: skip this round. Default: always. */
  mayAcquire?: () => boolean;
}

export class Lease implements LeaseHolder {
  private leader = false;
  private acquiring = false;
  private timer: NodeJS.Timeout | undefined;
  private stopped = false;

  constructor(
    private readonly redis: Redis,
    readonly key: string,
    readonly owner: string,
    readonly ttlMs: number,
    private readonly events: LeaseEvents,
    private readonly onError: (err: unknown) => void,
    private readonly options: LeaseOptions = {},
  ) {}

  get isLeader(): boolean {
    return this.leader;
  }

  /** An attempt to take the lease is out (it may yet succeed). */
  get isAcquiring(): boolean {
    return this.acquiring;
  }

  /** Starts contending; resolves once the first attempt to take the lease is done. */
  start(): Promise<void> {
    return this.tick();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    clearTimeout(this.timer);
    if (this.leader) {
      this.setLeader(false);
      await this.redis.eval(releaseScript, 1, this.key, this.owner).catch(this.onError);
    }
  }

  private async tick(): Promise<void> {
    let skipped = false;
    try {
      if (this.leader) {
        const renewed = await this.redis.eval(
          renewScript,
          1,
          this.key,
          this.owner,
          String(this.ttlMs),
        );
        if (renewed !== 1) this.setLeader(false);
      } else if (this.options.mayAcquire?.() === false) {
        skipped = true;
      } else {
        // Set before the await: the next pool's `mayAcquire` counts this attempt.
        this.acquiring = true;
        try {
          const taken = await this.redis.eval(
            acquireScript,
            1,
            this.key,
            this.owner,
            String(this.ttlMs),
          );
          if (taken === 1) this.setLeader(true);
        } finally {
          this.acquiring = false;
        }
      }
    } catch (err) {
      // Redis unreachable: we cannot prove we still hold the lease, so we do not.
      if (this.leader) this.setLeader(false);
      this.onError(err);
    }
    if (this.stopped) return;
    let period = this.leader ? this.ttlMs / 3 : Math.min(this.ttlMs / 3, 250);
    // A skipped round comes back after a random part of the period, so the pools of one
    // dispatcher do not keep one order in which the same pool always goes first.
    if (skipped) period *= 0.5 + Math.random() / 2;
    this.timer = setTimeout(() => void this.tick(), period);
  }

  private setLeader(leader: boolean): void {
    if (this.leader === leader || (leader && this.stopped)) return;
    this.leader = leader;
    if (leader) this.events.acquired();
    else this.events.lost();
  }
}
