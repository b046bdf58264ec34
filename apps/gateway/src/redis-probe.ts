// Whether Redis answers right now, known without asking on the request path. A stopped or
// partitioned Redis keeps its socket open, so the connection's status stays `ready`; only a
// command that goes unanswered shows it. A PING every half second, bounded by the command
// connection's timeout, keeps the answer at most about a second and a half old.
//
// The probe also keeps when Redis last answered. The held clients read that (through the loss
// watch, redis-loss.ts): a Redis silent for the grace period, counted from its last answer,
// is lost for them as a closed connection is. One PING past its timeout only makes `up`
// false for a moment, which refuses new requests; it fails nobody already held.
import { performance } from 'node:perf_hooks';
import type { Redis } from '@sluice/redis';

const PROBE_INTERVAL_MS = 500;

/** When Redis last answered, for the loss watch. */
export interface RedisAnswers {
  /** `performance.now()` at the last answer; undefined until the first. */
  readonly answeredAt: number | undefined;
  /** Called at every answer; returns the removal of the listener. */
  onAnswer(listener: () => void): () => void;
}

export class RedisProbe implements RedisAnswers {
  private answering = false;
  private inFlight = false;
  private timer: NodeJS.Timeout | undefined;
  private lastAnswer: number | undefined;
  private readonly listeners = new Set<() => void>();

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

  get answeredAt(): number | undefined {
    return this.lastAnswer;
  }

  onAnswer(listener: () => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
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
    if (!answering) return;
    this.lastAnswer = performance.now();
    for (const listener of [...this.listeners]) listener();
  }
}
