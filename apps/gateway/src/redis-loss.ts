// The reply connection lost. Frames reach this replica only over its subscriber connection;
// while that is down no held request can progress, and a Redis that comes back empty has
// lost the jobs too. A short outage (a failover, a restart with persistence) is ridden out:
// ioredis reconnects and resubscribes, and a stream that missed frames meanwhile sees the
// gap (`frame_lost`). Past the grace period every held client is answered, and the jobs
// they leave behind are taken back once Redis answers again.
import type { Redis } from '@sluice/redis';

export interface ReplyLossOptions {
  graceMs: number;
  /** The connection has been down for the grace period. */
  onLost(): void;
  /** It is ready again (after a loss, or within the grace). */
  onBack(afterLoss: boolean): void;
}

export class ReplyLossWatch {
  private timer: NodeJS.Timeout | undefined;
  private lost = false;
  private readonly onDown = () => this.down();
  private readonly onReady = () => this.up();

  constructor(
    private readonly subscriber: Redis,
    private readonly options: ReplyLossOptions,
  ) {
    for (const event of ['close', 'end', 'error'] as const) subscriber.on(event, this.onDown);
    subscriber.on('ready', this.onReady);
  }

  /** Frames can arrive: the subscriber connection is ready. */
  get connected(): boolean {
    return this.subscriber.status === 'ready';
  }

  stop(): void {
    clearTimeout(this.timer);
    for (const event of ['close', 'end', 'error'] as const) this.subscriber.off(event, this.onDown);
    this.subscriber.off('ready', this.onReady);
  }

  private down(): void {
    if (this.connected || this.timer || this.lost) return;
    this.timer = setTimeout(() => {
      this.timer = undefined;
      if (this.connected) return;
      this.lost = true;
      this.options.onLost();
    }, this.options.graceMs);
  }

  private up(): void {
    clearTimeout(this.timer);
    this.timer = undefined;
    const afterLoss = this.lost;
    this.lost = false;
    this.options.onBack(afterLoss);
  }
}
