// Is the gateway replica that holds a job's client still alive? Answers are cached briefly
// so a burst of releases for one replica costs one EXISTS.
//
// A missing liveness key proves a replica dead only once Redis has been reachable for a whole
// replica TTL: right after Redis comes back (empty, or from a file where the key expired),
// live replicas have not beaten yet, and their reply subscriptions may not be back either.
// Until then every replica counts as alive, and the signals that cancel work for a dead
// replica (reach.ts) wait.
import type { KeySpace } from '@sluice/protocol';
import type { Redis } from '@sluice/redis';

export class ReplicaLiveness {
  private readonly cache = new Map<string, { alive: boolean; until: number }>();
  private readyAt: number;

  constructor(
    private readonly redis: Redis,
    private readonly keys: KeySpace,
    private readonly cacheMs: number,
    private readonly ttlMs: number,
    private readonly now: () => number,
  ) {
    this.readyAt = now();
    redis.on('ready', () => {
      this.readyAt = this.now();
      this.cache.clear();
    });
  }

  /** True once Redis has been reachable long enough for a missing key to mean a dead replica. */
  settled(): boolean {
    return this.now() - this.readyAt >= this.ttlMs;
  }

  async isAlive(replica: string): Promise<boolean> {
    if (!this.settled()) return true;
    const now = this.now();
    const hit = this.cache.get(replica);
    if (hit && hit.until > now) return hit.alive;
    const alive = (await this.redis.exists(this.keys.replicaAlive(replica))) === 1;
    this.cache.set(replica, { alive, until: now + this.cacheMs });
    return alive;
  }
}
