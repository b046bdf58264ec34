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
    // Back at once after Redis returns (empty, or with the key expired), not a third of the
    // TTL later: until it beats, a dispatcher would take this replica for dead.
    this.redis.on('ready', this.onReady);
    await this.beat();
    this.timer = setInterval(() => void this.beat(), Math.max(100, Math.floor(this.ttlMs / 3)));
  }

  private readonly onReady = () => void this.beat();

  async stop(): Promise<void> {
    this.redis.off('ready', this.onReady);
    clearInterval(this.timer);
    await this.redis.del(this.key).catch(this.onError);
  }

  private async beat(): Promise<void> {
    await this.redis.set(this.key, '1', 'PX', this.ttlMs).catch(this.onError);
  }
}
