// One client held by this replica, from enqueue to the last byte.
//
//   queued ──start──▶ running ──end/error──▶ done
//     │                  │
//     └─park timeout / client gone / silence / lost frame──▶ done (with an explicit error)
//
// A streaming client gets `: keep-alive` every heartbeat until the first body byte: in the
// queue and through the engine's prefill. Its headers are committed at the first of the
// engine's response head or the first heartbeat due; after that a failure is delivered
// in-band as `data: {"error":...}` and the stream ends, so OpenAI SDKs raise it. A
// non-streaming client waits silently and gets the engine's status and body unchanged.
import { markStage } from '@sluice/observability';
import { SSE_KEEPALIVE, sseError } from '@sluice/openai';
import { sluiceHeaders, type Frame } from '@sluice/protocol';
import type { ServerResponse } from 'node:http';
import { refusal, writeRefusal, type Refusal } from './refuse.js';

export interface HeldRequestHooks {
  heartbeatMs: number;
  maxParkMs: number;
  slowClientBytes: number;
  now(): number;
  /** Removes the job if it is still queued; false when the dispatcher took it. */
  removeQueued(jobId: string): Promise<boolean>;
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
  private expectedSeq = 0;
  private firstByte = false;
  private parkTimer: NodeJS.Timeout | undefined;
  private heartbeatTimer: NodeJS.Timeout | undefined;
  private loadState = 'normal';
  private engine = '';
  /** Engine error body collected when the SSE head was already committed as 200. */
  private engineError: { status: number; chunks: Buffer[] } | undefined;

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

  /** Starts the park timer and heartbeats, and watches for the client leaving. */
  hold(): void {
    this.parkTimer = setTimeout(() => void this.parkTimeout(), this.hooks.maxParkMs);
    if (this.stream)
      this.heartbeatTimer = setInterval(() => this.heartbeat(), this.hooks.heartbeatMs);
    this.res.once('close', () => {
      if (this.state !== 'done') void this.clientGone();
    });
  }

  onFrame(frame: Frame): void {
    if (this.state === 'done') return;
    this.lastFrameAt = this.hooks.now();
    if (frame.seq !== this.expectedSeq) {
      this.hooks.cancel(this.jobId, 'frame_lost');
      this.fail(
        refusal(
          'frame_lost',
          `reply stream broken: expected frame ${this.expectedSeq}, got ${frame.seq}; the answer is incomplete`,
        ),
      );
      return;
    }
    this.expectedSeq += 1;
    switch (frame.type) {
      case 'start':
        this.started(frame.info.engine, frame.info.loadState);
        break;
      case 'head':
        this.head(frame.info.status, frame.info.contentType);
        break;
      case 'data':
        this.data(frame.chunk);
        break;
      case 'end':
        this.end();
        break;
      case 'error':
        this.fail(refusal(frame.info.code, frame.info.message, frame.info.retryAfter));
        break;
      case 'alive':
        break;
    }
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

  /** Ends the request with an error: a refusal if nothing was sent yet, in-band otherwise. */
  fail(r: Refusal): void {
    if (this.state === 'done') return;
    this.hooks.onRefused(this, r);
    const res = this.res;
    if (!res.headersSent) writeRefusal(res, r);
    else if (this.stream && !res.destroyed) res.end(sseError(r.message, r.type, r.reason));
    // A non-streaming body cut short must not look whole: end the connection without the
    // final chunk, so the client sees an error rather than a truncated answer.
    else res.destroy();
    this.finish();
  }

  private started(engine: string, loadState: string): void {
    if (this.state !== 'queued') return;
    markStage('gateway.frame-start');
    this.state = 'running';
    this.engine = engine;
    this.loadState = loadState;
    clearTimeout(this.parkTimer);
    // A stream whose headers went out with a keep-alive learns the load state in-band.
    if (this.stream && this.res.headersSent && !this.res.destroyed)
      this.res.write(`: ${sluiceHeaders.loadState}: ${loadState}\n\n`);
    this.hooks.onStarted(this, (this.hooks.now() - this.enqueuedAt) / 1000);
  }

  private responseHeaders(): Record<string, string> {
    const headers: Record<string, string> = { [sluiceHeaders.loadState]: this.loadState };
    if (this.engine) headers[sluiceHeaders.engine] = this.engine;
    return headers;
  }

  private commitStream(): void {
    if (this.res.headersSent) return;
    this.res.writeHead(200, {
      'content-type': 'text/event-stream; charset=utf-8',
      'cache-control': 'no-cache',
      ...this.responseHeaders(),
    });
  }

  private heartbeat(): void {
    if (this.firstByte || this.state === 'done') return;
    this.commitStream();
    this.res.write(SSE_KEEPALIVE);
    this.hooks.onHeartbeat();
  }

  private head(status: number, contentType: string): void {
    markStage('gateway.frame-head');
    if (this.res.headersSent) {
      // Committed by a heartbeat as 200: an engine error can only go in-band now.
      if (status >= 400) this.engineError = { status, chunks: [] };
      return;
    }
    if (this.stream && status === 200) return this.commitStream();
    this.res.writeHead(status, { 'content-type': contentType, ...this.responseHeaders() });
  }

  private data(chunk: Buffer): void {
    if (this.engineError) {
      this.engineError.chunks.push(chunk);
      return;
    }
    if (!this.firstByte) {
      this.firstByte = true;
      clearInterval(this.heartbeatTimer);
      this.hooks.onFirstByte(this);
    }
    // Only a client that does not drain counts as slow: write() says so once the socket's
    // buffer is full, and from then on what piles up here is bounded by the limit.
    if (!this.res.write(chunk) && this.res.writableLength > this.hooks.slowClientBytes) {
      this.hooks.cancel(this.jobId, 'slow_client');
      this.hooks.onRefused(this, refusal('slow_client', 'client reads too slowly'));
      this.res.destroy();
      this.finish();
    }
  }

  private end(): void {
    if (this.engineError) {
      const { status, chunks } = this.engineError;
      const text = Buffer.concat(chunks).toString('utf8');
      let message = text;
      try {
        message = (JSON.parse(text) as { error?: { message?: string } }).error?.message ?? text;
      } catch {
        // not JSON: pass the text as it came
      }
      this.res.end(
        sseError(
          `engine answered ${status}: ${message}`,
          status >= 500 ? 'server_error' : 'invalid_request_error',
          'engine_error',
        ),
      );
    } else {
      this.res.end();
    }
    markStage('gateway.response-end');
    this.finish();
  }

  private async parkTimeout(): Promise<void> {
    if (this.state !== 'queued') return;
    let removed = false;
    try {
      removed = await this.hooks.removeQueued(this.jobId);
    } catch {
      removed = false;
    }
    // Not removed: the dispatcher took the job in the meantime; it runs normally.
    if (!removed || this.state !== 'queued') return;
    const retryAfter = await this.hooks.retryAfter();
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
    this.hooks.onRefused(this, refusal('cancelled', 'client closed the connection'));
    this.finish();
    if (wasQueued && (await this.hooks.removeQueued(this.jobId).catch(() => false))) return;
    this.hooks.cancel(this.jobId, 'client_gone');
  }

  private finish(): void {
    if (this.state === 'done') return;
    const wasQueued = this.state === 'queued';
    this.state = 'done';
    clearTimeout(this.parkTimer);
    clearInterval(this.heartbeatTimer);
    this.hooks.onDone(this, wasQueued);
  }
}
