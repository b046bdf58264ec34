// This gateway replica's identity in Redis: a liveness key with a TTL, refreshed at a
// third of it, so the dispatcher skips jobs whose client is already gone with the replica.
import type { Redis } from '@sluice/redis';

export class ReplicaHeartbeat {
  private timer: NodeJS.Timeout | undefined;

  constructor(
    private readonly redis: Redis,
    private readonly key: string,
    private readonly ttlMs: number,
    private readonly onError: (err: unknown) => void,
  ) {}

  async start(): Promise<void> {
    await this.beat();
    this.timer = setInterval(() => void this.beat(), Math.max(100, Math.floor(this.ttlMs / 3)));
  }

  async stop(): Promise<void> {
    clearInterval(this.timer);
    await this.redis.del(this.key).catch(this.onError);
  }

  private async beat(): Promise<void> {
    await this.redis.set(this.key, '1', 'PX', this.ttlMs).catch(this.onError);
  }
}
