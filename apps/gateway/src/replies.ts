// This replica's reply channel: frames from the dispatcher, routed to held requests by
// job id, and a watchdog that ends requests whose dispatcher went silent. Silence counts only
// while the channel can carry frames: an outage of the connection itself, or a subscriber
// that stays connected and delivers nothing (deaf: reply-heartbeat.ts), is the business of
// the loss watch (redis-loss.ts), which answers with the reason that is true.
//
// A watchdog tick that comes more than one interval late ran after a stall of this gateway's
// own event loop (a long GC, a starved process): frames that came meanwhile still wait in
// the socket, read only after the timers, so the silence may be the gateway's. It judges at
// the next tick instead, after the loop has read them; that one judges even when late too,
// so a gateway that stalls at every tick still notices a dispatcher that died.
//
// A frame that goes on (not an end or an error) for a job this process never held is for an
// orphan: every job this process queues is in the table before its add, so before any frame
// of it can come. Whatever held it is gone (a dead process whose channel this one got), and
// nothing else would stop the engine generating it for nobody: its job is cancelled, once.
// Jobs ended here are remembered for a while instead: their request took them back as it
// ended (removed, cancelled, or answered whole), and their late frames need nothing more.
import { decodeFrame, frameJobId, frameType, messageFrames, ProtocolError } from '@sluice/protocol';
import type { Redis } from '@sluice/redis';
import type { HeldRequest } from './held-request.js';
import type { ReplyHearing } from './reply-heartbeat.js';

export class ReplyRouter {
  readonly held = new Map<string, HeldRequest>();
  private readonly watchdog: NodeJS.Timeout;
  private readonly tickMs: number;
  private lastTickAt: number;
  private skippedLateTick = false;
  private idleWaiters: (() => void)[] = [];
  // Jobs ended here or cancelled as orphans, in two generations of a silence timeout each:
  // their frames need nothing more. Objects, not Sets, for what comes and goes with every
  // request: a Set that grows keeps its old tables reachable (the dispatcher's id-table.ts).
  private settled: Record<string, true> = Object.create(null) as Record<string, true>;
  private settledBefore: Record<string, true> = Object.create(null) as Record<string, true>;
  private settledSince: number;

  constructor(
    private readonly subscriber: Redis,
    private readonly channel: string,
    private readonly silenceTimeoutMs: number,
    private readonly now: () => number,
    private readonly onBadFrame: (kind: 'undecodable' | 'unknown_job', detail: string) => void,
    /** Publishes a cancel for a job (cancels.ts). */
    private readonly cancel: (jobId: string, reason: string) => void,
    /** The reply-channel heartbeat: no silence is judged while the subscriber is deaf. */
    private readonly hearing?: ReplyHearing,
  ) {
    this.tickMs = Math.max(50, Math.floor(silenceTimeoutMs / 5));
    this.lastTickAt = now();
    this.settledSince = this.lastTickAt;
    this.watchdog = setInterval(() => this.tick(), this.tickMs);
    this.watchdog.unref();
  }

  async start(): Promise<void> {
    this.subscriber.on('messageBuffer', (channel: Buffer, message: Buffer) => {
      if (channel.toString() === this.channel) this.route(message);
    });
    // Back from an outage, or hearing again: a dispatcher that kept its requests gets a full
    // silence window.
    this.subscriber.on('ready', () => this.freshWindow());
    this.hearing?.onChange((deaf) => {
      if (!deaf) this.freshWindow();
    });
    await this.subscriber.subscribe(this.channel);
  }

  private freshWindow(): void {
    const now = this.now();
    for (const held of this.held.values()) held.lastFrameAt = Math.max(held.lastFrameAt, now);
  }

  stop(): void {
    clearInterval(this.watchdog);
  }

  /** A request ended: it leaves the table. */
  forget(jobId: string): void {
    this.held.delete(jobId);
    this.settled[jobId] = true;
    if (this.held.size === 0) for (const resolve of this.idleWaiters.splice(0)) resolve();
  }

  /** Resolves once no request is held. */
  whenIdle(): Promise<void> {
    if (this.held.size === 0) return Promise.resolve();
    return new Promise((resolve) => this.idleWaiters.push(resolve));
  }

  /** A message is one frame or a bundle of frames, each for its own request. */
  private route(message: Buffer): void {
    let frames: Buffer[];
    try {
      frames = messageFrames(message);
    } catch (err) {
      if (!(err instanceof ProtocolError)) throw err;
      // No frame of it can be trusted; its requests see the gap (HeldRequest.broken) or the
      // silence, and either cancels their jobs.
      this.onBadFrame('undecodable', err.message);
      return;
    }
    for (const frame of frames) this.routeFrame(frame);
  }

  private routeFrame(message: Buffer): void {
    const jobId = frameJobId(message);
    const held = jobId === undefined ? undefined : this.held.get(jobId);
    if (!held) {
      // Frames for a request that already ended (client gone, timed out) are expected.
      this.onBadFrame('unknown_job', jobId ?? '?');
      if (jobId !== undefined) this.orphan(jobId, message);
      return;
    }
    try {
      held.onFrame(decodeFrame(message));
    } catch (err) {
      // A frame that does not decode, or one whose writing threw anyway (decodeFrame checks
      // what goes into headers; anything it misses would throw from `writeHead`): this runs
      // inside the subscriber's message event, where a throw ends the process and every
      // request it holds. Only this request ends, as for any frame it cannot use.
      const detail =
        err instanceof ProtocolError ? err.message : `frame not applied: ${String(err)}`;
      this.onBadFrame('undecodable', detail);
      try {
        held.broken(detail);
      } catch {
        // Ending it threw too (its response is unusable): it must not take the process along,
        // nor stay in the table to be routed to again.
        this.forget(jobId!);
      }
    }
  }

  /** A frame of `jobId`, which is not held here: cancels the job if nothing else settles it. */
  private orphan(jobId: string, message: Buffer): void {
    if (this.settled[jobId] || this.settledBefore[jobId]) return;
    // Its type alone, from the first byte: a data frame is not decoded to be dropped. An
    // unreadable type is cancelled too: cancelling a job nobody here waits for costs nothing.
    const type = frameType(message);
    // The job is over already.
    if (type === 'end' || type === 'error') return;
    this.settled[jobId] = true;
    this.cancel(jobId, 'orphaned');
  }

  private tick(): void {
    const now = this.now();
    // A job settled a silence timeout or two ago whose frames still come is cancelled (again):
    // they would have stopped by now had its cancel been heard.
    if (now - this.settledSince >= this.silenceTimeoutMs) {
      this.settledBefore = this.settled;
      this.settled = Object.create(null) as Record<string, true>;
      this.settledSince = now;
    }
    const late = now - this.lastTickAt > 2 * this.tickMs;
    this.lastTickAt = now;
    if (late && !this.skippedLateTick) {
      this.skippedLateTick = true;
      return;
    }
    this.skippedLateTick = false;
    this.checkSilence(now);
  }

  private checkSilence(now: number): void {
    if (this.subscriber.status !== 'ready' || this.hearing?.deaf) return;
    const cutoff = now - this.silenceTimeoutMs;
    for (const held of this.held.values())
      if (held.state === 'running' && held.lastFrameAt < cutoff) held.silent();
  }
}
