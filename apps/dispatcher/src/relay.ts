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
// so a short request costs one PUBLISH, not three. A body that outgrows one data frame stops
// being kept and goes like a stream's.
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

/**
 * The most body bytes one data frame carries; a larger run of data goes in several frames, a
 * large chunk split between them. Redis queues each message whole for a subscriber, and by
 * default drops a subscriber past 32 MB (8 MB for 60 s) of queued messages
 * (`client-output-buffer-limit pubsub`): with one frame per answer, a single 40 MB
 * non-streamed answer closed a gateway's reply connection, and every request it held with it.
 * 256 KiB is a thirty-second of the soft limit and four frames to a bundle, and still holds
 * nearly every non-streamed answer (a completion's JSON is a few KiB), which then still goes
 * as one message (docs/redis.md).
 */
export const MAX_DATA_FRAME_BYTES = 256 * 1024;

export interface RelaySink {
  publish(channel: string, message: Buffer): void;
  onFrame?(type: Frame['type'], bytes: number): void;
}

export class ReplyRelay {
  private seq = 0;
  private pending: Buffer[] = [];
  /** The bytes in `pending`. */
  private pendingBytes = 0;
  /** The start, not sent yet, and when it was made. */
  private startInfo: StartInfo | undefined;
  private startedAt = 0;
  /** A non-streaming answer's head, kept until the end with its body. */
  private heldHead: HeadInfo | undefined;
  /** Head and body kept for the end: a non-streaming answer that still fits one data frame. */
  private holding: boolean;
  lastSentAt: number;
  finished = false;

  constructor(
    readonly jobId: string,
    private readonly channel: string,
    private readonly hub: RelayHub,
    now: number,
    /** A non-streaming answer: its frames go out together at the end, while they fit. */
    whole: boolean,
    /** Its key among the hub's open relays: unique, where a job id may run again. */
    readonly key: string,
  ) {
    this.lastSentAt = now;
    this.holding = whole;
  }

  start(info: StartInfo): void {
    this.startInfo = info;
    this.startedAt = this.hub.clock();
  }

  head(info: HeadInfo): void {
    if (this.holding) this.heldHead = info;
    else this.sendHead(info);
  }

  data(chunk: Buffer): void {
    if (this.holding) {
      this.pending.push(chunk);
      this.pendingBytes += chunk.length;
      if (this.pendingBytes > MAX_DATA_FRAME_BYTES) this.stopHolding();
      return;
    }
    if (this.pending.length === 0) this.hub.schedule(this);
    this.pending.push(chunk);
    this.pendingBytes += chunk.length;
  }

  end(info?: EndInfo): void {
    this.release();
    const frame: Frame = { type: 'end', jobId: this.jobId, seq: this.seq++ };
    if (info) frame.info = info;
    this.send(frame);
    this.finished = true;
  }

  error(info: ErrorInfo): void {
    if (this.heldHead) {
      // Nothing of the answer went out yet: without its head and partial body the gateway can
      // still answer the error's own status and OpenAI body, where a 200 head already sent
      // would leave it only a cut connection (an empty reply to the client).
      this.heldHead = undefined;
      this.pending = [];
      this.pendingBytes = 0;
      if (this.startInfo) this.sendStart();
    } else {
      this.release();
    }
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

  /** A non-streaming body too large for one frame: from here it goes as a stream does. */
  private stopHolding(): void {
    this.holding = false;
    if (this.heldHead) this.sendHead(this.heldHead);
    this.hub.schedule(this);
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

  /**
   * Publishes pending data: one frame, or several of at most MAX_DATA_FRAME_BYTES each (a
   * kept non-streaming answer's only at its end).
   */
  flush(): void {
    if (this.pending.length === 0 || this.finished || this.heldHead) return;
    const chunks = this.pending;
    const bytes = this.pendingBytes;
    this.pending = [];
    this.pendingBytes = 0;
    if (bytes <= MAX_DATA_FRAME_BYTES) return this.sendData(chunks);
    let part: Buffer[] = [];
    let room = MAX_DATA_FRAME_BYTES;
    for (let chunk of chunks) {
      while (chunk.length > 0) {
        if (room === 0) {
          this.sendData(part);
          part = [];
          room = MAX_DATA_FRAME_BYTES;
        }
        // A view, not a copy: the frame's encoding copies the bytes once.
        const piece = chunk.length <= room ? chunk : chunk.subarray(0, room);
        part.push(piece);
        room -= piece.length;
        chunk = chunk.subarray(piece.length);
      }
    }
    if (part.length > 0) this.sendData(part);
  }

  private sendData(chunks: readonly Buffer[]): void {
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

  /** `whole`: a non-streaming answer, sent in one message at its end while it fits one frame. */
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
