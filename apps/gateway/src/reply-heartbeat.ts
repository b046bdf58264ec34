// Whether the reply subscriber still delivers. Its connection can stay `ready` and deliver
// nothing: the cluster node it sits on hangs (SIGSTOP, a partition: the socket stays open,
// and the cluster marks the node failed, which moves ioredis's subscriber, only after
// cluster-node-timeout), or a proxy or NAT on the way dropped the connection's state (half
// open: nothing ever closes it). The PING probe (redis-probe.ts) asks over the command
// connection, which may sit elsewhere, and sees none of it; every reply frame meanwhile goes
// nowhere while /readyz says 200.
//
// So the gateway PUBLISHes a small heartbeat through its command connection, every half
// second, on a channel of its own that the subscriber connection listens to beside the reply
// channel (one SUBSCRIBE set, one socket: what silences one silences the other). A heartbeat
// that Redis acknowledged and that has not come back for the bound means the subscriber is
// deaf. It is judged from the acknowledgement, not the send: a PUBLISH unanswered (Redis
// away) says nothing about the subscriber, and the loss watch has Redis's own silence. Nor is
// it judged while the command connection does not answer the probe (the fault is not the
// subscriber's) or while the subscriber is reconnecting (redis-loss.ts watches that).
//
// Deaf: the replica refuses new requests and /readyz answers 503 (main.ts), the loss watch
// counts towards answering held clients (redis-loss.ts), and the subscriber connection is
// recycled: dropped, so that ioredis connects again (on a Cluster, to a node picked afresh)
// and subscribes again. Deafness lasts until a heartbeat comes back; a new connection just as
// deaf is judged, and recycled, the same way, one bound later.
//
// A judgement whose timer came more than an interval late ran after a stall of this process's
// event loop: a heartbeat may be waiting in the socket, read only after the timers. It is
// made at the next tick instead (as the reply router's silence watchdog does).
import { performance } from 'node:perf_hooks';
import { isCluster, type Redis } from '@sluice/redis';

/** How often the heartbeat is published: one PUBLISH per replica per interval. */
export const REPLY_HEARTBEAT_MS = 500;

/**
 * How long an acknowledged heartbeat may take to come back: half the loss grace
 * (SLUICE_REDIS_LOSS_GRACE_SECONDS) or of the reply silence timeout
 * (SLUICE_RELAY_SILENCE_TIMEOUT_MS), whichever is shorter (2 s by default), so that deafness
 * is known, and the subscriber recycled, before held clients are answered for the loss or
 * blamed on their dispatcher; and at least 1 s (two heartbeats), so that a busy cluster bus
 * is not taken for a deaf subscriber.
 */
export function deafAfterMs(redisLossGraceMs: number, silenceTimeoutMs: number): number {
  return Math.max(1000, Math.floor(Math.min(redisLossGraceMs, silenceTimeoutMs) / 2));
}

/** Whether the subscriber delivers, for the loss watch and the reply router. */
export interface ReplyHearing {
  /** An acknowledged heartbeat did not come back in time, and none has since. */
  readonly deaf: boolean;
  /** `now()` at the last heartbeat heard (at the start before the first). */
  readonly heardAt: number;
  /** Called when `deaf` changes; returns the removal of the listener. */
  onChange(listener: (deaf: boolean) => void): () => void;
}

export interface ReplyHeartbeatOptions {
  /** The command connection: it publishes. */
  publisher: Redis;
  /** The connection the reply channel is subscribed on. */
  subscriber: Redis;
  channel: string;
  deafMs: number;
  intervalMs?: number;
  /** The command connection answers (the probe's `up`): only then is the subscriber judged. */
  answering(): boolean;
  /** Default `performance.now`. */
  now?: () => number;
  /** Found deaf (each time): `silentMs` since the last heartbeat heard. */
  onDeaf?(silentMs: number): void;
  /** Heard again after deafness. */
  onHeard?(): void;
}

interface Acked {
  seq: number;
  at: number;
}

export class ReplyHeartbeat implements ReplyHearing {
  private timer: NodeJS.Timeout | undefined;
  private seq = 0;
  private heardSeq = 0;
  /** Heartbeats acknowledged and not heard yet, oldest first. */
  private acked: Acked[] = [];
  private isDeaf = false;
  private lastHeard: number;
  private lastTickAt: number;
  private skippedLateTick = false;
  private readonly listeners = new Set<(deaf: boolean) => void>();
  private readonly now: () => number;
  private readonly intervalMs: number;
  private readonly onMessage = (channel: Buffer, message: Buffer) => {
    if (channel.toString() === this.options.channel) this.heard(Number(message.toString()));
  };
  // A connection (re)made and subscribed again: heartbeats lost while it was away say nothing
  // about it.
  private readonly onReady = () => (this.acked = []);

  constructor(private readonly options: ReplyHeartbeatOptions) {
    this.now = options.now ?? (() => performance.now());
    this.intervalMs = options.intervalMs ?? REPLY_HEARTBEAT_MS;
    this.lastHeard = this.now();
    this.lastTickAt = this.lastHeard;
  }

  get deaf(): boolean {
    return this.isDeaf;
  }

  get heardAt(): number {
    return this.lastHeard;
  }

  onChange(listener: (deaf: boolean) => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  /** Subscribes the heartbeat channel and starts publishing. */
  async start(): Promise<void> {
    const { subscriber, channel } = this.options;
    subscriber.on('messageBuffer', this.onMessage);
    subscriber.on('ready', this.onReady);
    handleResubscribeFailures(subscriber);
    await subscriber.subscribe(channel);
    this.lastHeard = this.lastTickAt = this.now();
    this.timer = setInterval(() => void this.tick(), this.intervalMs);
    this.timer.unref();
  }

  stop(): void {
    clearInterval(this.timer);
    this.timer = undefined;
    this.options.subscriber.off('messageBuffer', this.onMessage);
    this.options.subscriber.off('ready', this.onReady);
  }

  /**
   * Judges the subscriber, then publishes the next heartbeat; resolves once Redis answered
   * the PUBLISH (or failed it). The timer's work; tests call it with their own clock.
   */
  async tick(): Promise<void> {
    const now = this.now();
    const late = now - this.lastTickAt > 2 * this.intervalMs;
    this.lastTickAt = now;
    if (late && !this.skippedLateTick) this.skippedLateTick = true;
    else {
      this.skippedLateTick = false;
      this.judge(now);
    }
    await this.publish();
  }

  private async publish(): Promise<void> {
    const { publisher, channel } = this.options;
    if (publisher.status !== 'ready') return;
    const seq = ++this.seq;
    try {
      await publisher.publish(channel, String(seq));
    } catch {
      // Unanswered: the probe and the loss watch tell Redis's own absence.
      return;
    }
    // Heard before its acknowledgement was read: nothing to wait for.
    if (seq > this.heardSeq) this.acked.push({ seq, at: this.now() });
  }

  private heard(seq: number): void {
    if (!Number.isSafeInteger(seq) || seq <= this.heardSeq) return;
    this.heardSeq = seq;
    this.lastHeard = this.now();
    // One connection carries them in order: one heard means the earlier ones were lost before
    // it (a reconnect), not that they still come.
    while (this.acked.length > 0 && this.acked[0]!.seq <= seq) this.acked.shift();
    if (!this.isDeaf) return;
    this.isDeaf = false;
    this.options.onHeard?.();
    this.emit();
  }

  private judge(now: number): void {
    const oldest = this.acked[0];
    if (oldest === undefined || now - oldest.at < this.options.deafMs) return;
    if (this.options.subscriber.status !== 'ready' || !this.options.answering()) return;
    // The recycled connection is judged on heartbeats published from now on.
    this.acked = [];
    const wasDeaf = this.isDeaf;
    this.isDeaf = true;
    this.options.onDeaf?.(now - this.lastHeard);
    recycleSubscriber(this.options.subscriber);
    if (!wasDeaf) this.emit();
  }

  private emit(): void {
    for (const listener of [...this.listeners]) listener(this.isDeaf);
  }
}

/**
 * Gives every SUBSCRIBE promise of `subscriber` a handler, ioredis's own included. After a
 * reconnect ioredis (5.9, readyHandler) subscribes again without one, and keeps that SUBSCRIBE
 * for the next connection while Redis has not answered it (it is sent again there); only a
 * connection closed for good (the gateway's shutdown) rejects it, and unhandled, that
 * rejection would end the process with a failure. Recycling a hung connection makes such an
 * unanswered SUBSCRIBE likely. Callers still see their own promise reject. A Cluster's
 * subscriber handles its own.
 */
function handleResubscribeFailures(subscriber: Redis): void {
  if (isCluster(subscriber) || handled.has(subscriber)) return;
  handled.add(subscriber);
  const subscribe = subscriber.subscribe;
  subscriber.subscribe = function (this: Redis, ...args: unknown[]) {
    const subscribed = (subscribe as (...a: unknown[]) => Promise<unknown>).apply(this, args);
    subscribed.catch(() => {});
    return subscribed;
  } as typeof subscribe;
}

const handled = new WeakSet<Redis>();

/** The one connection ioredis's Cluster subscribes on (private: ClusterSubscriber). */
interface ClusterSubscriberShape {
  getInstance?(): { stream?: { destroy(): void }; disconnect(): void } | null;
}

/**
 * Drops the subscriber's socket so that ioredis connects again and subscribes again. Destroyed,
 * not ended: `disconnect()` ends the socket and waits for the peer's close, which a hung node
 * or a half-open connection never sends.
 * - One node or Sentinel: the connection reconnects by itself (retryStrategy) and subscribes
 *   again (autoResubscribe); through Sentinel it asks where the master is now.
 * - Cluster: ioredis keeps one subscriber connection, to a node picked at random from the slot
 *   map, and never retries it: once it ends, the Cluster picks a node again and subscribes its
 *   channels there (ClusterSubscriber's `onSubscriberEnd`). It may pick the hung node again
 *   while the slot map still lists it; that one is judged deaf in turn.
 */
export function recycleSubscriber(subscriber: Redis): void {
  if (isCluster(subscriber)) {
    const inner = (subscriber as unknown as { subscriber?: ClusterSubscriberShape }).subscriber;
    const instance = inner?.getInstance?.();
    if (instance?.stream) return instance.stream.destroy();
    if (instance) return instance.disconnect();
    // Not the ioredis this was written against: reconnect the whole subscriber Cluster.
    return subscriber.disconnect(true);
  }
  if (subscriber.stream) subscriber.stream.destroy();
  else subscriber.disconnect(true);
}
