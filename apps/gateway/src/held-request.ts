// One client held by this replica, from enqueue to the last byte.
//
//   queued ──start──▶ running ──end/error──▶ done
//     │                  │
//     └─park timeout / client gone / silence / lost frame / slow reader──▶ done (explicit error)
//     └─abandoned by the replica (Redis lost, job lost, shutdown)──▶ done, job taken back
//
// A streaming client gets `: keep-alive` every heartbeat until the first body byte: in the
// queue and through the engine's prefill. Its headers are committed at the first of the
// engine's response head or the first heartbeat due; after that a failure is delivered
// in-band as `data: {"error":...}` and the stream ends, so OpenAI SDKs raise it. A
// non-streaming client waits silently and gets the engine's status and body unchanged.
// An event stream goes out whole events at a time (SseEvents), so that an in-band error lands
// on an event boundary whatever TCP did to the engine's chunks.
import { markStage } from '@sluice/observability';
import { SSE_DONE, SSE_KEEPALIVE, sseData, sseErrorEnd } from '@sluice/openai';
import { sluiceHeaders, type EndInfo, type Frame } from '@sluice/protocol';
import { SseEvents } from './sse-events.js';
import type { ServerResponse } from 'node:http';
import type { QueuedRemoval } from './pool-queue.js';
import {
  QUEUE_LOST_MESSAGE,
  refusal,
  withoutEngineDetails,
  writeRefusal,
  type Refusal,
} from './refuse.js';

export interface HeldRequestHooks {
  heartbeatMs: number;
  maxParkMs: number;
  slowClientBytes: number;
  /** A socket that has not drained for this long is cut and its engine request cancelled. */
  slowClientStallMs: number;
  /** The client may learn which engine served it and what failed there (refuse.ts). */
  engineDetails: boolean;
  now(): number;
  /** Removes the job if it is still queued (see PoolQueue.removeQueued). */
  removeQueued(jobId: string): Promise<QueuedRemoval>;
  /** The Redis key that exists while the job does. */
  jobKey(jobId: string): string;
  cancel(jobId: string, reason: string): void;
  retryAfter(): Promise<number>;
  onHeartbeat(): void;
  onStarted(held: HeldRequest, queueWaitSeconds: number): void;
  onFirstByte(held: HeldRequest): void;
  onRefused(held: HeldRequest, r: Refusal): void;
  /** `wasQueued`: the request ended before the dispatcher took it. */
  onDone(held: HeldRequest, wasQueued: boolean): void;
}

type State = 'queued' | 'running' | 'done';

export class HeldRequest {
  state: State = 'queued';
  lastFrameAt: number;
  /** The add to the queue resolved: from now on the job exists in Redis until taken. */
  added = false;
  // What the access log and the response metrics read once the request is done (onDone).
  /**
   * The status the answer amounts to: the one sent, or, for an answer that failed after its
   * head went out (in-band error, cut connection), its refusal's; 499 when the client left.
   */
  status = 0;
  /** The refusal reason of an answer that Sluice ended, or `engine_error` for an engine's. */
  reason: string | undefined;
  /** Enqueue to release, as `onStarted` observed it. */
  queueWaitMs: number | undefined;
  /** When the first byte of the engine's body was written to the client. */
  firstByteAt: number | undefined;
  /** The counts the dispatcher's end frame carried. */
  tokens: EndInfo | undefined;
  /** The refusal's full message, when the client was told less (`engineDetails` false). */
  detail: string | undefined;
  private expectedSeq = 0;
  private firstByte = false;
  private parkTimer: NodeJS.Timeout | undefined;
  private heartbeatTimer: NodeJS.Timeout | undefined;
  private stallTimer: NodeJS.Timeout | undefined;
  /** An answer's frames not handed to the socket yet, and whether one is with it (sendAnswer). */
  private unsent: Buffer[] = [];
  private writing = false;
  /** The answer ended while frames of it were still unsent: it ends once they are out. */
  private endWhenSent = false;
  private loadState = 'normal';
  private engine = '';
  /**
   * Engine error body collected when the SSE head was already committed as 200: at most
   * SLUICE_SLOW_CLIENT_BYTES of it (`cut` once more came), as SseEvents holds at most that.
   */
  private engineError:
    { status: number; chunks: Buffer[]; bytes: number; cut: boolean } | undefined;
  /** Set once the response is committed as an event stream. */
  private events: SseEvents | undefined;

  constructor(
    readonly jobId: string,
    readonly model: string,
    readonly stream: boolean,
    readonly receivedAt: number,
    readonly enqueuedAt: number,
    private readonly res: ServerResponse,
    private readonly hooks: HeldRequestHooks,
  ) {
    this.lastFrameAt = enqueuedAt;
  }

  /**
   * Starts the park timer and heartbeats, and watches for the client leaving. Called before the
   * add: a client that left while the route awaited (the leader check, the long-prompt wait)
   * had its 'close' already, so it is gone now, with no job to take back; the caller must not
   * add one (`state` is `done`).
   */
  hold(): void {
    if (this.res.destroyed) return this.left();
    this.parkTimer = setTimeout(() => void this.parkTimeout(), this.hooks.maxParkMs);
    if (this.stream)
      this.heartbeatTimer = setInterval(() => this.heartbeat(), this.hooks.heartbeatMs);
    this.res.once('close', () => {
      if (this.state !== 'done') void this.clientGone();
      // An answer that was still going out (sendAnswer) has nothing left to watch.
      else this.disarmStall();
    });
  }

  onFrame(frame: Frame): void {
    if (this.state === 'done') return;
    this.lastFrameAt = this.hooks.now();
    if (frame.seq !== this.expectedSeq) {
      // A new leader refusing a job its dead predecessor had started (release-loop.ts): its
      // relay counts from 0, and what it says is the job's end.
      if (frame.seq === 0 && frame.type === 'error')
        return this.fail(refusal(frame.info.code, frame.info.message, frame.info.retryAfter));
      return this.broken(`expected frame ${this.expectedSeq}, got ${frame.seq}`);
    }
    this.expectedSeq += 1;
    switch (frame.type) {
      case 'start':
        this.started(frame.info.engine, frame.info.loadState, frame.info.sentAfterMs ?? 0);
        break;
      case 'head':
        this.head(frame.info.status, frame.info.contentType);
        break;
      case 'data':
        this.data(frame.chunk);
        break;
      case 'end':
        this.tokens = frame.info;
        this.end();
        break;
      case 'error':
        this.fail(refusal(frame.info.code, frame.info.message, frame.info.retryAfter));
        break;
      case 'alive':
        break;
    }
  }

  get jobKey(): string {
    return this.hooks.jobKey(this.jobId);
  }

  /** Queued in Redis and not taken yet: the job must exist, or it was lost. */
  get parked(): boolean {
    return this.state === 'queued' && this.added;
  }

  /** The dispatcher went silent past the liveness timeout. */
  silent(): void {
    if (this.state !== 'running') return;
    this.hooks.cancel(this.jobId, 'dispatcher_lost');
    this.fail(
      refusal(
        'dispatcher_lost',
        'the dispatcher running this request stopped answering; the answer is incomplete',
        1,
      ),
    );
  }

  /**
   * A frame of this request was lost or cannot be read: the answer can never be completed, so
   * the engine must stop producing it too. Every broken-frame path ends here, so none can
   * leave an engine generating for nobody.
   */
  broken(detail: string): void {
    if (this.state === 'done') return;
    this.hooks.cancel(this.jobId, 'frame_lost');
    this.fail(refusal('frame_lost', `reply stream broken: ${detail}; the answer is incomplete`));
  }

  /** Ends the request with an error: a refusal if nothing was sent yet, in-band otherwise. */
  fail(r: Refusal): void {
    if (this.state === 'done') return;
    this.hooks.onRefused(this, r);
    if (!this.hooks.engineDetails) {
      const told = withoutEngineDetails(r);
      if (told !== r) this.detail = r.message;
      r = told;
    }
    const res = this.res;
    this.reason = r.reason;
    // writeRefusal never sends 499: nobody would read it.
    this.status = r.status === 499 && !res.headersSent ? 503 : r.status;
    // Frames of an answer still waiting for the socket (sendAnswer) never go out now.
    this.unsent = [];
    this.endWhenSent = false;
    if (!res.headersSent) writeRefusal(res, r);
    // Only whole events went out (SseEvents): the error starts on a boundary, and a held
    // half-event is dropped with the request.
    else if (this.stream && !res.destroyed) res.end(sseErrorEnd(r.message, r.type, r.reason));
    // A non-streaming body cut short must not look whole: end the connection without the
    // final chunk, so the client sees an error rather than a truncated answer.
    else res.destroy();
    this.finish();
  }

  /**
   * Ends the request from this replica's side (Redis lost, job lost, shutting down): answers
   * `r` now and returns the taking back of its job (removed if still queued, else the
   * dispatcher is asked to cancel it), for the caller to run now or once Redis is back.
   */
  abandon(r: Refusal, cancelReason: string): () => Promise<void> {
    const wasQueued = this.state === 'queued';
    if (this.state === 'done') return async () => {};
    this.fail(r);
    return () => this.takeBack(wasQueued, cancelReason);
  }

  /** `sentAfterMs`: how long after the release the dispatcher sent the start (with the head). */
  private started(engine: string, loadState: string, sentAfterMs: number): void {
    if (this.state !== 'queued') return;
    markStage('gateway.frame-start');
    this.state = 'running';
    this.engine = engine;
    this.loadState = loadState;
    clearTimeout(this.parkTimer);
    // A stream whose headers went out with a keep-alive learns the load state in-band.
    if (this.stream && this.res.headersSent && !this.res.destroyed)
      this.res.write(`: ${sluiceHeaders.loadState}: ${loadState}\n\n`);
    const waitedMs = Math.max(0, this.hooks.now() - this.enqueuedAt - sentAfterMs);
    this.queueWaitMs = waitedMs;
    this.hooks.onStarted(this, waitedMs / 1000);
  }

  private responseHeaders(): Record<string, string> {
    const headers: Record<string, string> = { [sluiceHeaders.loadState]: this.loadState };
    if (this.engine && this.hooks.engineDetails) headers[sluiceHeaders.engine] = this.engine;
    return headers;
  }

  private commitStream(): void {
    if (this.res.headersSent) return;
    this.status = 200;
    this.events = new SseEvents(this.hooks.slowClientBytes);
    this.res.writeHead(200, {
      'content-type': 'text/event-stream; charset=utf-8',
      'cache-control': 'no-cache',
      ...this.responseHeaders(),
    });
  }

  private heartbeat(): void {
    if (this.firstByte || this.state === 'done') return;
    this.commitStream();
    this.send(SSE_KEEPALIVE);
    this.hooks.onHeartbeat();
  }

  /**
   * Writes an event stream to a client that must keep reading: one whose socket has not
   * drained for the stall limit, or that has the byte limit buffered, is cut and its engine
   * request cancelled, so it does not hold a slot for nobody.
   */
  private send(chunk: Buffer | string): void {
    if (this.res.destroyed || this.res.write(chunk)) return;
    // A write larger than the limit says nothing about the reader (the rest of a stream that
    // ended, written at once): only bytes buffered before it, which the client has not taken,
    // count against SLUICE_SLOW_CLIENT_BYTES.
    const behind = this.res.writableLength - byteLength(chunk);
    if (behind > this.hooks.slowClientBytes)
      return this.slowClient(`client reads too slowly (${behind} bytes buffered and not taken)`);
    if (this.stallTimer) return;
    this.armStall();
    this.res.once('drain', () => this.disarmStall());
  }

  /**
   * Writes an answer that is not an event stream (a non-streamed answer, an error body): the
   * engine's finished work, which the dispatcher relays in 256 KiB frames much faster than a
   * client reads. It has no byte limit, which would cut a client reading at any normal speed:
   * its bytes are in memory here whether the client takes them or not, and cutting it stops
   * no engine. It goes out one frame at a time instead, the next once the socket has taken
   * the last, and only a client that takes nothing for the stall limit is cut. Handed to the
   * socket at once, a backlog would go out as one write that completes, and drains, only at
   * its last byte, so a steady reader of a long answer would look stalled.
   */
  private sendAnswer(chunk: Buffer): void {
    this.unsent.push(chunk);
    if (!this.writing) this.writeNext();
  }

  private writeNext(): void {
    this.disarmStall();
    // Cut or ended meanwhile (fail): nothing more goes out; a write after the end would be an
    // 'error' on the response that nothing listens to.
    if (this.res.destroyed || this.res.writableEnded) this.unsent = [];
    const next = this.unsent.shift();
    if (next === undefined) {
      this.writing = false;
      if (this.endWhenSent && !this.res.destroyed) this.res.end();
      // Ended while this went out: its last bytes are watched until they are taken.
      if (this.res.writableEnded) this.watchEnded();
      return;
    }
    this.writing = true;
    this.armStall();
    this.res.write(next, this.wrote);
  }

  private readonly wrote = (): void => this.writeNext();

  private armStall(): void {
    this.stallTimer ??= setTimeout(() => {
      this.stallTimer = undefined;
      // Answered already: no engine request is left to cancel, only the socket and what is
      // buffered for it.
      if (this.state === 'done') return void this.res.destroy();
      this.slowClient(
        `client read nothing for ${this.hooks.slowClientStallMs / 1000} s (SLUICE_SLOW_CLIENT_STALL_SECONDS)`,
      );
    }, this.hooks.slowClientStallMs);
  }

  private disarmStall(): void {
    clearTimeout(this.stallTimer);
    this.stallTimer = undefined;
  }

  /**
   * An ended answer stays under the stall limit until the socket has taken its last byte: a
   * client that stopped reading never takes it, and the server has no idle timeout (main.ts),
   * so its socket and up to SLUICE_SLOW_CLIENT_BYTES would stay for good. 'close' comes once
   * the answer is finished, or when the client leaves.
   */
  private watchEnded(): void {
    // An answer still going out frame by frame is watched by its writes (writeNext).
    if (this.writing) return;
    const res = this.res;
    if (!res.writableEnded || res.writableLength === 0 || res.destroyed) return this.disarmStall();
    this.armStall();
    res.once('close', () => this.disarmStall());
  }

  private slowClient(message: string): void {
    if (this.state === 'done') return;
    this.hooks.cancel(this.jobId, 'slow_client');
    const r = refusal('slow_client', message);
    this.status = r.status;
    this.reason = r.reason;
    this.hooks.onRefused(this, r);
    this.res.destroy();
    this.finish();
  }

  private head(status: number, contentType: string): void {
    markStage('gateway.frame-head');
    if (this.res.headersSent) {
      // Committed by a heartbeat as 200: an engine error can only go in-band now.
      if (status >= 400) this.engineError = { status, chunks: [], bytes: 0, cut: false };
      return;
    }
    if (this.stream && status === 200) return this.commitStream();
    this.status = status;
    // The body is the engine's now, not an event stream: a keep-alive comment would corrupt it.
    clearInterval(this.heartbeatTimer);
    this.res.writeHead(status, { 'content-type': contentType, ...this.responseHeaders() });
  }

  private data(chunk: Buffer): void {
    if (this.engineError) return this.holdEngineError(chunk);
    const whole = this.events ? this.events.complete(chunk) : chunk;
    if (whole) this.body(whole);
  }

  private holdEngineError(chunk: Buffer): void {
    const held = this.engineError!;
    if (held.cut) return;
    const room = this.hooks.slowClientBytes - held.bytes;
    // A copy of the part kept: a view would hold the whole frame's buffer.
    const kept = chunk.length > room ? Buffer.from(chunk.subarray(0, room)) : chunk;
    held.cut = kept !== chunk;
    held.chunks.push(kept);
    held.bytes += kept.length;
  }

  private body(bytes: Buffer): void {
    if (this.firstByte) return this.write(bytes);
    this.firstByte = true;
    clearInterval(this.heartbeatTimer);
    this.write(bytes);
    this.firstByteAt = this.hooks.now();
    this.hooks.onFirstByte(this);
  }

  private write(bytes: Buffer): void {
    if (this.events) this.send(bytes);
    else this.sendAnswer(bytes);
  }

  private end(): void {
    if (this.engineError) {
      const { status, chunks, cut } = this.engineError;
      this.status = status;
      this.reason = 'engine_error';
      this.res.end(engineErrorEvent(status, Buffer.concat(chunks).toString('utf8'), cut));
    } else {
      // An engine may end its stream without the last blank line: those bytes are its too.
      const rest = this.events?.rest();
      if (rest) this.body(rest);
      // That last write can find the client too slow, which ended the request already.
      if (this.state === 'done') return;
      // Frames of the answer still unsent go out first (sendAnswer).
      if (this.unsent.length > 0) this.endWhenSent = true;
      else this.res.end();
    }
    markStage('gateway.response-end');
    this.finish();
  }

  private async parkTimeout(): Promise<void> {
    if (this.state !== 'queued') return;
    let removal: QueuedRemoval | 'error';
    try {
      removal = await this.hooks.removeQueued(this.jobId);
    } catch {
      // Redis did not answer in time. The job is past its deadline now, so a dispatcher that
      // takes it later drops it; the client must not wait for that.
      removal = 'error';
    }
    // Taken: the dispatcher took the job in the meantime; it runs normally.
    if (removal === 'taken' || this.state !== 'queued') return;
    if (removal === 'missing') return this.fail(refusal('queue_lost', QUEUE_LOST_MESSAGE));
    if (removal === 'error')
      return this.fail(refusal('redis_unavailable', 'queue unavailable (Redis does not answer)'));
    const retryAfter = await this.hooks.retryAfter().catch(() => undefined);
    this.fail(
      refusal(
        'park_timeout',
        `no capacity within ${Math.round(this.hooks.maxParkMs / 1000)} s; retry later`,
        retryAfter,
      ),
    );
  }

  private async clientGone(): Promise<void> {
    const wasQueued = this.state === 'queued';
    this.left();
    await this.takeBack(wasQueued, 'client_gone');
  }

  private left(): void {
    const r = refusal('cancelled', 'client closed the connection');
    this.status = r.status;
    this.reason = r.reason;
    this.hooks.onRefused(this, r);
    this.finish();
  }

  /**
   * A queued job is removed; any other (running, taken meanwhile, not in Redis yet or any
   * more, Redis not answering) gets a cancel, which the dispatcher also remembers for a job
   * it has not released yet.
   */
  private async takeBack(wasQueued: boolean, reason: string): Promise<void> {
    if (wasQueued) {
      const removal = await this.hooks.removeQueued(this.jobId).catch(() => 'error' as const);
      if (removal === 'removed') return;
    }
    this.hooks.cancel(this.jobId, reason);
  }

  private finish(): void {
    if (this.state === 'done') return;
    const wasQueued = this.state === 'queued';
    this.state = 'done';
    clearTimeout(this.parkTimer);
    clearInterval(this.heartbeatTimer);
    this.watchEnded();
    this.hooks.onDone(this, wasQueued);
  }
}

function byteLength(chunk: Buffer | string): number {
  return typeof chunk === 'string' ? Buffer.byteLength(chunk) : chunk.length;
}

/**
 * An engine error that came after the stream's head went out as 200, as the in-band events
 * that end the stream. vLLM's own error body goes out as the error event, as vLLM itself
 * writes an error in a stream, so the client reads the engine's message, type, param and code
 * (an int: the status) whether or not its request waited in the queue. Only a body that is not
 * vLLM's error (not JSON, another shape, cut at the bound) gets Sluice's `engine_error`.
 */
function engineErrorEvent(status: number, text: string, cut = false): string {
  const own = cut ? undefined : vllmStreamError(text);
  if (own !== undefined) return sseData(own) + SSE_DONE;
  return sseErrorEnd(
    `engine answered ${status}: ${text}${cut ? '… (cut)' : ''}`,
    status >= 500 ? 'server_error' : 'invalid_request_error',
    'engine_error',
  );
}

/**
 * What vLLM writes in a stream for the error body `text`, or undefined when `text` is not a
 * vLLM error. vLLM ends a failed stream with `data: {create_streaming_error_response(...)}`
 * then `data: [DONE]` (vllm/entrypoints/openai/chat_completion/serving.py; older:
 * serving_chat.py):
 * - newer: `json.dumps(self.create_error_response(...).model_dump())`
 *   (vllm/entrypoints/openai/engine/serving.py), an ErrorResponse
 *   `{"error":{"message","type","param","code"}}` (engine/protocol.py ErrorInfo): its error
 *   body itself, sent unchanged;
 * - older: the error body was the flat ErrorResponse `{"object":"error","message","type",
 *   "param","code"}` (vllm/entrypoints/openai/protocol.py) and the event
 *   `json.dumps({"error": ....model_dump()})` (serving_engine.py): that body under `error`,
 *   which is also what OpenAI SDKs look for to raise.
 * A CR or LF in valid JSON can only lie between tokens (a string holds them escaped), so a
 * space in its place keeps every value as the engine wrote it and the event on one line.
 */
function vllmStreamError(text: string): string | undefined {
  let body: unknown;
  try {
    body = JSON.parse(text);
  } catch {
    return undefined;
  }
  if (!isObject(body)) return undefined;
  const line = text.trim().replace(/[\r\n]/g, ' ');
  if (isObject(body.error) && typeof body.error.message === 'string') return line;
  if (body.object === 'error' && typeof body.message === 'string') return `{"error":${line}}`;
  return undefined;
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}
