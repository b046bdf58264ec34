// Reply frames for one job, published on its gateway replica's channel.
//
// Data chunks that arrive together (a busy engine emits many tokens per tick) are joined
// into one frame, and every frame made in one turn of the event loop goes out at the end of
// it: one PUBLISH per gateway replica, bundling the frames of all its jobs, so a token costs
// neither a Redis round trip nor a command of its own.
// A relay that sent nothing for `livenessMs` sends an `alive` frame, so the gateway can
// tell a long prefill from a dead dispatcher.
//
// The start frame waits for the engine's head (or the liveness tick, or the end) and goes in
// the same message; a non-streaming answer (`whole`) keeps its head and body until the end,
// so a short request costs one PUBLISH, not three.
import {
  encodeBundle,
  encodeDataFrame,
  encodeFrame,
  type EndInfo,
  type ErrorInfo,
  type Frame,
  type HeadInfo,
  type StartInfo,
} from '@sluice/protocol';
import type { Redis } from '@sluice/redis';
import { IdTable } from './id-table.js';

export interface RelaySink {
  publish(channel: string, message: Buffer): void;
  onFrame?(type: Frame['type'], bytes: number): void;
}

export class ReplyRelay {
  private seq = 0;
  private pending: Buffer[] = [];
  /** The start, not sent yet, and when it was made. */
  private startInfo: StartInfo | undefined;
  private startedAt = 0;
  /** A non-streaming answer's head, kept until the end with its body. */
  private heldHead: HeadInfo | undefined;
  lastSentAt: number;
  finished = false;

  constructor(
    readonly jobId: string,
    private readonly channel: string,
    private readonly hub: RelayHub,
    now: number,
    /** A non-streaming answer: its frames go out together at the end. */
    private readonly whole: boolean,
    /** Its key among the hub's open relays: unique, where a job id may run again. */
    readonly key: string,
  ) {
    this.lastSentAt = now;
  }

  start(info: StartInfo): void {
    this.startInfo = info;
    this.startedAt = this.hub.clock();
  }

  head(info: HeadInfo): void {
    if (this.whole) this.heldHead = info;
    else this.sendHead(info);
  }

  data(chunk: Buffer): void {
    if (this.whole) {
      this.pending.push(chunk);
      return;
    }
    if (this.pending.length === 0) this.hub.schedule(this);
    this.pending.push(chunk);
  }

  end(info?: EndInfo): void {
    this.release();
    const frame: Frame = { type: 'end', jobId: this.jobId, seq: this.seq++ };
    if (info) frame.info = info;
    this.send(frame);
    this.finished = true;
  }

  error(info: ErrorInfo): void {
    this.release();
    this.send({ type: 'error', jobId: this.jobId, seq: this.seq++, info });
    this.finished = true;
  }

  alive(now: number): void {
    if (this.finished || now - this.lastSentAt < this.hub.livenessMs) return;
    if (this.startInfo) this.sendStart();
    else this.send({ type: 'alive', jobId: this.jobId, seq: this.seq++ });
  }

  /** Everything made so far goes out, in order: the start, a kept head, the data. */
  private release(): void {
    if (this.heldHead) this.sendHead(this.heldHead);
    else if (this.startInfo) this.sendStart();
    this.flush();
  }

  private sendStart(): void {
    const info = this.startInfo!;
    this.startInfo = undefined;
    const sentAfterMs = Math.max(0, this.hub.clock() - this.startedAt);
    this.send({
      type: 'start',
      jobId: this.jobId,
      seq: this.seq++,
      // The spread last, not `{ ...info, sentAfterMs }`: on Node 20 a property added after a
      // leading spread makes a new hidden class on every evaluation, old garbage that kept each
      // request's objects through young collections (docs/performance.md, "A property after a
      // spread"). Spread, so that a field StartInfo gains still travels.
      info: { sentAfterMs, ...info },
    });
  }

  private sendHead(info: HeadInfo): void {
    this.heldHead = undefined;
    if (this.startInfo) this.sendStart();
    this.send({ type: 'head', jobId: this.jobId, seq: this.seq++, info });
  }

  /** Publishes pending data as one frame (a non-streaming answer's only at its end). */
  flush(): void {
    if (this.pending.length === 0 || this.finished || this.heldHead) return;
    const chunks = this.pending;
    this.pending = [];
    const message = encodeDataFrame(this.jobId, this.seq++, chunks);
    this.hub.publish(this, message, 'data', message.length);
  }

  private send(frame: Frame): void {
    if (this.finished) return;
    this.hub.publish(this, encodeFrame(frame), frame.type, 0);
  }

  get channelName(): string {
    return this.channel;
  }
}

/** Largest bundle: a longer run of frames for one replica goes out in several messages. */
const BUNDLE_BYTES = 1024 * 1024;

const bundle = (frames: Buffer[]) => (frames.length === 1 ? frames[0]! : encodeBundle(frames));

/** Owns the flush turn and the liveness timer for every relay of a dispatcher. */
export class RelayHub {
  // The relays with data to flush and the frames made in this turn are new tables each turn,
  // and the open relays are an IdTable, never a Set or a Map that is cleared or churned: V8
  // keeps every table a Map or Set replaced, with what it held, alive from the old one
  // (id-table.ts).
  private due = new Set<ReplyRelay>();
  /** Open relays by their key. */
  private readonly live = new IdTable<ReplyRelay>();
  private opened = 0;
  /** Frames made in this turn, per replica channel, in the order they were made. */
  private outbox = new Map<string, Buffer[]>();
  private flushScheduled = false;
  /** Waiting for this turn's frames to be written (see `written`). */
  private writtenWaiters: Array<() => void> = [];
  private readonly timer: NodeJS.Timeout;

  constructor(
    private readonly publisher: Redis,
    readonly livenessMs: number,
    private readonly now: () => number,
    private readonly onFrame: (type: Frame['type'], bytes: number) => void = () => {},
    /** A publish on `channel` reached no subscriber: no gateway holds its clients now. */
    private readonly onUnheard: (channel: string) => void = () => {},
  ) {
    this.timer = setInterval(() => this.sendLiveness(), Math.max(50, Math.floor(livenessMs / 2)));
    this.timer.unref();
  }

  /** `whole`: a non-streaming answer, sent in one message at its end. */
  open(jobId: string, channel: string, whole = false): ReplyRelay {
    const key = `r${(this.opened += 1)}`;
    const relay = new ReplyRelay(jobId, channel, this, this.now(), whole, key);
    this.live.set(key, relay);
    return relay;
  }

  close(relay: ReplyRelay): void {
    relay.flush();
    this.live.delete(relay.key);
    this.due.delete(relay);
  }

  schedule(relay: ReplyRelay): void {
    this.due.add(relay);
    this.scheduleFlush();
  }

  publish(relay: ReplyRelay, message: Buffer, type: Frame['type'], dataBytes: number): void {
    relay.lastSentAt = this.now();
    this.onFrame(type, dataBytes);
    const frames = this.outbox.get(relay.channelName);
    if (frames) frames.push(message);
    else this.outbox.set(relay.channelName, [message]);
    this.scheduleFlush();
  }

  /**
   * Resolves once the frames made so far are written to Redis (at the end of this turn), not
   * answered: what is written after reaches Redis behind them. The job runner waits for it
   * before BullMQ's completion, so a reply never queues behind that bookkeeping.
   */
  written(): Promise<void> {
    if (!this.flushScheduled) return Promise.resolve();
    return new Promise((resolve) => this.writtenWaiters.push(resolve));
  }

  /** Stops the liveness timer and sends what this turn has made so far. */
  stop(): void {
    clearInterval(this.timer);
    this.flush();
  }

  private scheduleFlush(): void {
    if (this.flushScheduled) return;
    this.flushScheduled = true;
    setImmediate(() => this.flush());
  }

  private flush(): void {
    // Still marked as scheduled while relays flush their data into the outbox below.
    const due = this.due;
    this.due = new Set();
    for (const r of due) r.flush();
    const outbox = this.outbox;
    this.outbox = new Map();
    // Each PUBLISH is written at once: the `command` role leaves PUBLISH out of its
    // auto-pipelining (libs/redis connect.ts). An ioredis pipeline object per flush did the
    // same in one write, but those objects outlive a young-generation collection and were
    // the largest share of what the dispatcher promoted (docs/performance.md).
    for (const [channel, frames] of outbox) {
      let first = 0;
      let bytes = 0;
      frames.forEach((frame, i) => {
        if (i > first && bytes + frame.length > BUNDLE_BYTES) {
          this.send(channel, bundle(frames.slice(first, i)));
          first = i;
          bytes = 0;
        }
        bytes += 4 + frame.length;
      });
      this.send(channel, bundle(frames.slice(first)));
    }
    this.flushScheduled = false;
    const waiters = this.writtenWaiters;
    this.writtenWaiters = [];
    // Every PUBLISH above is written to the socket (or queued while Redis is away).
    for (const resolve of waiters) resolve();
  }

  /**
   * One PUBLISH. A failed one is not retried: the gateway notices the gap or the silence and
   * tells its client, which is the honest outcome. PUBLISH answers how many subscribers got
   * the message: none means no gateway holds that channel's clients now.
   */
  private send(channel: string, message: Buffer): void {
    this.publisher.publish(channel, message).then(
      (receivers) => {
        if (receivers === 0) this.onUnheard(channel);
      },
      () => {},
    );
  }

  /** The hub's clock, for the relays. */
  clock(): number {
    return this.now();
  }

  private sendLiveness(): void {
    const now = this.now();
    for (const relay of this.live.values()) relay.alive(now);
  }
}
