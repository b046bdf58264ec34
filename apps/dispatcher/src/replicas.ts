// Is the gateway replica that holds a job's client still alive? Answers are cached briefly
// so a burst of releases for one replica costs one EXISTS.
import type { KeySpace } from '@sluice/protocol';
import type { Redis } from '@sluice/redis';

export class ReplicaLiveness {
  private readonly cache = new Map<string, { alive: boolean; until: number }>();

  constructor(
    private readonly redis: Redis,
    private readonly keys: KeySpace,
    private readonly cacheMs: number,
    private readonly now: () => number,
  ) {}

  async isAlive(replica: string): Promise<boolean> {
    const now = this.now();
    const hit = this.cache.get(replica);
    if (hit && hit.until > now) return hit.alive;
    const alive = (await this.redis.exists(this.keys.replicaAlive(replica))) === 1;
    this.cache.set(replica, { alive, until: now + this.cacheMs });
    return alive;
  }
}
