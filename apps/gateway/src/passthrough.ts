// Ungated backends (embeddings, Ollama, anything not observed): proxied straight through
// with undici, the response streamed unbuffered (an event stream whole events at a time, so
// that an error the gateway ends it with never lands mid-event).
//
// A shutdown drains pass-through requests as it drains held ones: `whenIdle` says when none
// is left, and `cutAll` ends those still running at the end of the drain period with the
// gateway's own reason (503 before the head; in-band after it for an event stream).
//
// The backend's Authorization is its own `apiKey` when the file gives one. Without one, the
// client's header is forwarded only when no tenants are configured (as before tenants
// existed: the client's key was meant for the backend); with tenants the client's key is a
// Sluice key, which no backend may see, so the backend gets none. A pool's engine (the
// tokenizer routes) gets its own key or none, never the client's, as from the dispatcher.
// Every target gets the request id and, when well-formed, the client's W3C trace context and
// `x-data-parallel-rank`, as a gated request's engine does (`forwardedHeaders`).
//
// Given several targets (the engines of a pool), a request that no target answered goes to
// the next one: only before any byte of an answer, and only for idempotent paths (the
// callers pass one target otherwise).
//
// Timed as the dispatcher times an engine (apps/dispatcher/src/engine-call.ts): the head, and
// after it the body's first byte, within the headers time-out; each later chunk within the
// body time-out of the one before. A backend such as vLLM sends a stream's head at once, so
// undici's own body timer (from the head) cut a stream whose prefill outlasted it; it is off.
import { once } from 'node:events';
import type { IncomingHttpHeaders, ServerResponse } from 'node:http';
import { sseErrorEnd } from '@sluice/openai';
import { engineRequestHeaders, type RejectReason } from '@sluice/protocol';
import { Agent, request } from 'undici';
import {
  dataParallelRankOf,
  REQUEST_ID_HEADER,
  traceparentOf,
  tracestateOf,
} from './request-id.js';
import { refusal, withoutEngineDetails, writeRefusal, type Refusal } from './refuse.js';
import { SseEvents } from './sse-events.js';

/**
 * How much of an event stream may wait for its event to complete: past it, the bytes go out
 * as they come (a body that never ends an event is not held whole).
 */
const MAX_HELD_EVENT_BYTES = 1024 * 1024;

const hopByHop = new Set([
  'connection',
  'keep-alive',
  'transfer-encoding',
  'upgrade',
  'proxy-connection',
  'te',
  'trailer',
  // The answer carries the gateway's request id (set on the response), not the backend's.
  REQUEST_ID_HEADER,
]);

/**
 * The gateway's CORS policy (cors.ts, set on the raw response) answers for it, not the
 * backend's: vLLM allows every origin by default, and `writeHead`'s headers would win.
 */
function isCorsHeader(name: string): boolean {
  return name.startsWith('access-control-');
}

/** The backend's `Vary` after the one the gateway set (cors.ts: `Origin`), not in its place. */
function withOwnVary(res: ServerResponse, value: string | string[]): string | string[] {
  const own = res.getHeader('vary');
  return own === undefined ? value : [String(own), ...(Array.isArray(value) ? value : [value])];
}

/** Where a pass-through request goes: the backend's origin and its own key, if any. */
export interface PassthroughTarget {
  readonly url: string;
  readonly apiKey?: string;
  /** A pool's gated engine: it gets its own key or none, never the client's. */
  readonly engine?: true;
}

/** The Authorization header the backend gets, if any (see the top of this file). */
export function backendAuthorization(
  target: PassthroughTarget,
  clientAuthorization: string | undefined,
  tenants: boolean,
): string | undefined {
  if (target.apiKey !== undefined) return `Bearer ${target.apiKey}`;
  return tenants || target.engine ? undefined : clientAuthorization;
}

/** How a pass-through request ended, for the access log and the response metrics. */
export interface PassthroughAnswer {
  /** The backend's status; the refusal's when Sluice answered; 499 when the client left. */
  status: number;
  reason?: RejectReason;
  /** The refusal's full message, when the client was told less (see `engineDetails`). */
  detail?: string;
}

/** How long a backend may keep a pass-through request waiting (see the top of this file). */
export interface PassthroughTimeouts {
  /** Until the response head, and from the head until the body's first byte. */
  headersTimeoutMs: number;
  /** Longest gap between two body chunks after the first. */
  bodyTimeoutMs: number;
  /**
   * Longest a client may take nothing of the answer (SLUICE_SLOW_CLIENT_STALL_SECONDS): past
   * it the client is cut and the backend's request ended, as for a gated answer. Without it,
   * a client that stops reading would hold the backend's work (its KV cache, for a vLLM) and
   * both sockets' buffers for as long as it kept the connection open.
   */
  slowClientStallMs?: number;
}

/** The defaults of ENGINE_HEADERS_TIMEOUT_MS and ENGINE_BODY_TIMEOUT_MS (libs/config). */
export const defaultPassthroughTimeouts: PassthroughTimeouts = {
  headersTimeoutMs: 900_000,
  bodyTimeoutMs: 300_000,
  slowClientStallMs: 30_000,
};

export class Passthrough {
  private readonly agent: Agent;
  /** The requests in progress, each by the function that ends it from the gateway's side. */
  private readonly running = new Set<(r: Refusal) => void>();
  private idleWaiters: (() => void)[] = [];

  /**
   * `tenants`: whether client keys are Sluice's own (then never forwarded). `engineDetails`:
   * whether a client may read a backend's address in a failure's message (refuse.ts).
   */
  constructor(
    private readonly tenants: boolean,
    private readonly timeouts: PassthroughTimeouts = defaultPassthroughTimeouts,
    private readonly engineDetails = true,
  ) {
    this.agent = new Agent({ headersTimeout: timeouts.headersTimeoutMs, bodyTimeout: 0 });
  }

  /** Requests in progress. */
  get size(): number {
    return this.running.size;
  }

  /** Resolves once no request is in progress (at once when none is). */
  whenIdle(): Promise<void> {
    if (this.running.size === 0) return Promise.resolve();
    return new Promise((resolve) => this.idleWaiters.push(resolve));
  }

  /**
   * Ends every request in progress with `r` (their forward calls answer it); returns how
   * many. Await `whenIdle` for their answers to be written.
   */
  cutAll(r: Refusal): number {
    const cuts = [...this.running];
    for (const cut of cuts) cut(r);
    return cuts.length;
  }

  /**
   * Proxies one request to `target`, or to each of `target` in turn while none answers (a
   * connection refused, reset or timed out before the head: nothing reached the client).
   */
  async forward(
    target: PassthroughTarget | readonly PassthroughTarget[],
    path: string,
    headers: IncomingHttpHeaders,
    body: Buffer,
    res: ServerResponse,
  ): Promise<PassthroughAnswer> {
    const targets: readonly PassthroughTarget[] = Array.isArray(target) ? target : [target];
    const controller = new AbortController();
    let cutBy: Refusal | undefined;
    let events: SseEvents | undefined;
    const cut = (r: Refusal) => {
      if (controller.signal.aborted) return;
      cutBy = r;
      controller.abort();
    };
    const silence = new BodySilence(this.timeouts, (wait, baseUrl) =>
      cut(silenceRefusal(wait, baseUrl, this.timeouts)),
    );
    // Registered before the first await: the drain that starts next must see this request.
    this.running.add(cut);
    res.once('close', () => controller.abort());
    const sent = forwardedHeaders(headers, res);
    try {
      for (let i = 0; ; i++) {
        const baseUrl = targets[i]!.url;
        const authorization = backendAuthorization(
          targets[i]!,
          headers.authorization,
          this.tenants,
        );
        try {
          const upstream = await request(new URL(path, baseUrl), {
            method: 'POST',
            dispatcher: this.agent,
            headers: {
              ...sent,
              ...(authorization ? { authorization } : {}),
            },
            body,
            signal: controller.signal,
          });
          const out: Record<string, string | string[]> = {};
          for (const [name, value] of Object.entries(upstream.headers))
            if (value !== undefined && !hopByHop.has(name) && !isCorsHeader(name))
              out[name] = name === 'vary' ? withOwnVary(res, value) : value;
          if (String(upstream.headers['content-type'] ?? '').startsWith('text/event-stream'))
            events = new SseEvents(MAX_HELD_EVENT_BYTES);
          res.writeHead(upstream.statusCode, out);
          silence.head(baseUrl);
          const stallMs =
            this.timeouts.slowClientStallMs ?? defaultPassthroughTimeouts.slowClientStallMs!;
          const stalled = () =>
            cut(
              refusal(
                'slow_client',
                `client read nothing for ${stallMs / 1000} s (SLUICE_SLOW_CLIENT_STALL_SECONDS)`,
              ),
            );
          await relay(upstream.body, res, events, controller.signal, silence, {
            stallMs,
            stalled,
          });
          return { status: upstream.statusCode };
        } catch (err) {
          // A client that reads nothing cannot read an error either: its connection ends.
          if (cutBy?.reason === 'slow_client') {
            res.destroy();
            return { status: cutBy.status, reason: cutBy.reason };
          }
          if (cutBy) return this.answered(res, cutBy, events !== undefined);
          if (controller.signal.aborted) return { status: 499, reason: 'cancelled' };
          if (!res.headersSent) {
            // Nothing was answered: the next target may.
            if (i + 1 < targets.length) continue;
            const r = refusal(
              'engine_unreachable',
              `${targets.length > 1 ? `none of ${targets.length} backends answered; ` : ''}backend ${baseUrl} unreachable: ${(err as Error).message}`,
              5,
            );
            return this.answered(res, r, false);
          }
          res.destroy();
          // The backend failed mid-answer: what its status promised did not arrive whole.
          const r = refusal('engine_error', `backend ${baseUrl} failed mid-answer`);
          return { status: r.status, reason: r.reason, ...this.detail(r) };
        }
      }
    } finally {
      silence.stop();
      this.running.delete(cut);
      if (this.running.size === 0) for (const idle of this.idleWaiters.splice(0)) idle();
    }
  }

  close(): Promise<void> {
    return this.agent.close();
  }

  /** Answers `r` as this gateway may tell it (`engineDetails`), the full message kept aside. */
  private answered(res: ServerResponse, r: Refusal, eventStream: boolean): PassthroughAnswer {
    const told = this.engineDetails ? r : withoutEngineDetails(r);
    return { ...endedByGateway(res, told, eventStream), ...this.detail(r) };
  }

  /** The full message of `r` if a client without engine details was told another. */
  private detail(r: Refusal): { detail?: string } {
    return this.engineDetails || withoutEngineDetails(r) === r ? {} : { detail: r.message };
  }
}

/**
 * The request headers every target gets: the id the access log names the request by, and what
 * vLLM reads of the client's own headers (the W3C trace context, `x-data-parallel-rank`) when
 * well-formed, as a gated request's engine gets them from the dispatcher (request-id.ts).
 */
function forwardedHeaders(
  headers: IncomingHttpHeaders,
  res: ServerResponse,
): Record<string, string> {
  const sent: Record<string, string> = {
    'content-type': 'application/json',
    [REQUEST_ID_HEADER]: String(res.getHeader(REQUEST_ID_HEADER) ?? ''),
  };
  const traceparent = traceparentOf(headers);
  if (traceparent !== undefined) {
    sent[engineRequestHeaders.traceparent] = traceparent;
    const tracestate = tracestateOf(headers);
    if (tracestate !== undefined) sent[engineRequestHeaders.tracestate] = tracestate;
  }
  const dataParallelRank = dataParallelRankOf(headers);
  if (dataParallelRank !== undefined)
    sent[engineRequestHeaders.dataParallelRank] = dataParallelRank;
  return sent;
}

/**
 * Copies the backend's body to the client as the client reads it. Not `pipeline`: on an
 * error it destroys the client's response, and a request the gateway ends must still get its
 * in-band error.
 */
async function relay(
  body: AsyncIterable<Buffer>,
  res: ServerResponse,
  events: SseEvents | undefined,
  signal: AbortSignal,
  silence: BodySilence,
  stall: { stallMs: number; stalled: () => void },
): Promise<void> {
  for await (const chunk of body) {
    silence.chunk();
    const out = events ? events.complete(chunk) : chunk;
    if (out && !res.write(out)) {
      // The client is slow, not the backend: undici's body timer did not run while its
      // reader was paused either. The client's own wait is bounded instead.
      silence.stop();
      const timer = setTimeout(stall.stalled, stall.stallMs);
      try {
        await once(res, 'drain', { signal });
      } finally {
        clearTimeout(timer);
      }
      silence.chunk();
    }
  }
  const rest = events?.rest();
  if (rest) res.write(rest);
  res.end();
}

/**
 * A backend silent past its time-out, ended by the gateway: no first byte after the head is a
 * prefill past its bound (`engine_timeout`, as from the dispatcher), a gap between chunks a
 * backend stuck mid-answer.
 */
function silenceRefusal(
  wait: 'first' | 'gap',
  baseUrl: string,
  { headersTimeoutMs, bodyTimeoutMs }: PassthroughTimeouts,
): Refusal {
  if (wait === 'first')
    return refusal(
      'engine_timeout',
      `backend ${baseUrl} sent no body within ${headersTimeoutMs / 1000} s of its response ` +
        "head (ENGINE_HEADERS_TIMEOUT_MS; a stream's prefill must end within it)",
    );
  return refusal(
    'engine_error',
    `backend ${baseUrl} failed mid-answer: nothing for ${bodyTimeoutMs / 1000} s after the ` +
      'last chunk (ENGINE_BODY_TIMEOUT_MS)',
  );
}

/**
 * The wait for a backend's next body byte: the first within the headers time-out of the head
 * (a stream's prefill), each next one within the body time-out of the one before.
 */
class BodySilence {
  private timer: NodeJS.Timeout | undefined;
  private baseUrl = '';
  private sawFirst = false;

  constructor(
    private readonly timeouts: PassthroughTimeouts,
    private readonly silent: (wait: 'first' | 'gap', baseUrl: string) => void,
  ) {}

  /** The head of `baseUrl`'s answer came: its first body byte is awaited. */
  head(baseUrl: string): void {
    this.baseUrl = baseUrl;
    this.arm('first', this.timeouts.headersTimeoutMs);
  }

  /** A chunk came (or the client drained): the next gap starts. */
  chunk(): void {
    if (this.sawFirst && this.timer) this.timer.refresh();
    else {
      this.sawFirst = true;
      this.arm('gap', this.timeouts.bodyTimeoutMs);
    }
  }

  stop(): void {
    clearTimeout(this.timer);
    this.timer = undefined;
  }

  private arm(wait: 'first' | 'gap', ms: number): void {
    this.stop();
    this.timer = setTimeout(() => this.silent(wait, this.baseUrl), ms);
    // The request's own sockets keep the process up; the timer need not.
    this.timer.unref();
  }
}

/** A request the gateway ends (a shutdown), answered as a held request would be. */
function endedByGateway(res: ServerResponse, r: Refusal, eventStream: boolean): PassthroughAnswer {
  if (!res.headersSent) writeRefusal(res, r);
  // Only whole events went out: the error starts on a boundary; a held half-event is dropped.
  else if (eventStream && !res.destroyed) res.end(sseErrorEnd(r.message, r.type, r.reason));
  // A body cut short must not look whole: the connection ends without the final chunk.
  else res.destroy();
  return { status: r.status, reason: r.reason };
}
