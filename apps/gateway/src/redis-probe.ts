// Whether Redis answers right now, known without asking on the request path. A stopped or
// partitioned Redis keeps its socket open, so the connection's status stays `ready`; only a
// command that goes unanswered shows it. A PING every half second, bounded by the command
// connection's timeout, keeps the answer at most about a second and a half old.
import type { Redis } from '@sluice/redis';

const PROBE_INTERVAL_MS = 500;

export class RedisProbe {
  private answering = false;
  private inFlight = false;
  private timer: NodeJS.Timeout | undefined;

  constructor(
    private readonly redis: Redis,
    private readonly onChange: (up: boolean) => void = () => {},
  ) {}

  start(): void {
    if (this.timer) return;
    void this.ping();
    this.timer = setInterval(() => void this.ping(), PROBE_INTERVAL_MS);
    this.timer.unref();
  }

  stop(): void {
    clearInterval(this.timer);
    this.timer = undefined;
  }

  /** Connected, and the last PING was answered. */
  get up(): boolean {
    return this.redis.status === 'ready' && this.answering;
  }

  private async ping(): Promise<void> {
    if (this.inFlight) return;
    this.inFlight = true;
    let answering = false;
    try {
      answering = (await this.redis.ping()) === 'PONG';
    } catch {
      answering = false;
    } finally {
      this.inFlight = false;
    }
    if (answering !== this.answering) {
      this.answering = answering;
      this.onChange(answering);
    }
  }
}
