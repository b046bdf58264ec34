// Calls an engine with undici and relays its response as reply frames. The response body
// is passed through as bytes: the dispatcher never parses what the engine streams.
import type { EngineConfig } from '@sluice/config';
import { markStage } from '@sluice/observability';
import {
  engineRequestHeaders,
  type CompletionPath,
  type EndInfo,
  type JobPayload,
} from '@sluice/protocol';
import { Pool, type Dispatcher } from 'undici';
import type { Cancellation } from './cancels.js';
import type { ReplyRelay } from './relay.js';

export interface EngineTimeouts {
  /**
   * Until the response head, and from the head until the body's first byte. vLLM sends a
   * non-streamed answer's head only with its body, so there it bounds the whole generation.
   * A stream's head comes at once, before the prefill: the route returns
   * `StreamingResponse(content=generator, ...)` (vllm/entrypoints/openai/chat_completion/
   * api_router.py; api_server.py in older trees), whose `stream_response` sends
   * `http.response.start` before it reads the generator (starlette/responses.py), and uvicorn
   * writes the head on that message. So for a stream it is the first token's wait (the
   * prefill, minutes on a long prompt) that this bounds.
   */
  headersTimeoutMs: number;
  /** Longest gap between two body chunks after the first. */
  bodyTimeoutMs: number;
}

/** What the caller watches of a response body as it is relayed. */
export interface ResponseWatch {
  /** The first chunk of the body, with the status of the head it came under. */
  firstByte?(status: number): void;
  data?(chunk: Buffer): void;
  /** At the end of the body: the token counts the end frame carries, if any. */
  end?(): EndInfo | undefined;
}

/**
 * How a call ended; `sluice_completed_total` counts them by this name (its HELP and
 * docs/metrics.md list them). `client_error`: the engine refused the request with a 4xx (a
 * prompt over max_model_len, a parameter it does not take), relayed to the client as it came.
 */
export const callOutcomes = [
  'ok',
  'client_error',
  'engine_error',
  'engine_unreachable',
  'engine_timeout',
  'cancelled',
] as const;
export type CallOutcome = (typeof callOutcomes)[number];

/** A whole answer's outcome by its status: a 4xx is the request's fault, not the engine's. */
function answered(status: number): CallOutcome {
  if (status >= 500) return 'engine_error';
  return status >= 400 ? 'client_error' : 'ok';
}

/**
 * What the engine is told of the client's request (JobPayload, validated): sent as the
 * headers the client would have sent vLLM (`engineRequestHeaders`). A job's payload is one.
 */
export type ClientContext = Pick<
  JobPayload,
  'requestId' | 'traceparent' | 'tracestate' | 'dataParallelRank'
>;

/** undici's code for a response head that did not come within `headersTimeout`. */
const HEADERS_TIMEOUT = 'UND_ERR_HEADERS_TIMEOUT';

/**
 * Why the call's own timer ended it: no body byte within the headers time-out after the head
 * (`first`: a stream's prefill), or a gap past the body time-out between two chunks (`gap`).
 */
class EngineSilence extends Error {
  constructor(readonly wait: 'first' | 'gap') {
    super(wait === 'first' ? 'no first body byte in time' : 'no body chunk in time');
  }
}

export class EngineClient {
  private readonly pool: Pool;
  /** The request headers every call sends, made once (undici reads them, never changes them). */
  private readonly headers: Readonly<Record<string, string>>;
  private readonly headersTimeoutMs: number;
  private readonly bodyTimeoutMs: number;

  constructor(
    readonly config: EngineConfig,
    timeouts: EngineTimeouts,
  ) {
    this.headersTimeoutMs = timeouts.headersTimeoutMs;
    this.bodyTimeoutMs = timeouts.bodyTimeoutMs;
    this.pool = new Pool(config.url, {
      headersTimeout: timeouts.headersTimeoutMs,
      // Off: undici's body timer runs from the head, so it cut every stream whose prefill
      // outlasted ENGINE_BODY_TIMEOUT_MS (5 min by default; an 80k-token prompt prefills for
      // about 340 s on the homelab profile) before its first token. Each call keeps its own
      // timers instead: the headers time-out to the first body byte, the body time-out
      // between chunks.
      bodyTimeout: 0,
      // One connection per in-flight request: no request waits behind another's stream.
      connections: config.maxInflight,
      pipelining: 1,
      keepAliveTimeout: 30_000,
    });
    this.headers = Object.freeze({
      'content-type': 'application/json',
      ...(config.apiKey && { authorization: `Bearer ${config.apiKey}` }),
    });
  }

  get name(): string {
    return this.config.name;
  }

  /**
   * Sends `body` to the engine and relays the answer; never throws. `watch.firstByte` runs
   * once, at the first chunk of the response body (for a 2xx stream: the first token; for an
   * error answer: its error body, which says nothing of a prefill);
   * `watch.data` sees every chunk as it is relayed.
   *
   * After the head the body's first byte must come within the headers time-out (a stream's
   * prefill: vLLM sends its head at once), then each chunk within the body time-out of the
   * one before (`EngineTimeouts`). A prefill past its bound ends as `engine_timeout`, a gap
   * between chunks as `engine_error`; either way the connection closes and vLLM aborts the
   * request.
   *
   * Dispatched with a handler of its own rather than `request()`: each chunk goes from
   * undici's parser straight to the relay, without a Readable, an async iterator and a promise
   * per chunk on the per-token path.
   *
   * `client`: the request id, trace context and data-parallel rank the engine gets as headers
   * (the job's payload; already validated, so sent as they are).
   */
  call(
    path: CompletionPath,
    body: string | Buffer,
    relay: ReplyRelay,
    cancellation: Cancellation,
    watch: ResponseWatch = {},
    client: ClientContext = {},
  ): Promise<CallOutcome> {
    return new Promise((resolve) => {
      let status = 0;
      let first = watch.firstByte;
      let controller: Dispatcher.DispatchController | undefined;
      // Once settled (ended, failed or cancelled, maybe from inside a watcher), nothing more
      // reaches the relay: an error frame is always the last.
      let settled = false;
      let stopListening = () => {};
      // The wait for the body's next byte: its first one, then each next chunk.
      let silence: NodeJS.Timeout | undefined;
      let waiting: EngineSilence['wait'] | undefined;
      const settle = (outcome: CallOutcome) => {
        settled = true;
        clearTimeout(silence);
        stopListening();
        resolve(outcome);
      };
      const fail = (err: unknown) => settle(this.failed(err, status !== 0, relay, cancellation));
      // Settles first, so the error frame is this one; the abort then closes the connection
      // (vLLM aborts a request whose client disconnects) and its error is ignored.
      const silent = (wait: EngineSilence['wait']) => {
        const err = new EngineSilence(wait);
        if (!settled) fail(err);
        controller?.abort(err);
      };
      const awaitBody = (wait: EngineSilence['wait'], ms: number) => {
        clearTimeout(silence);
        waiting = wait;
        silence = setTimeout(silent, ms, wait);
        // An open call holds its socket, which keeps the process up; the timer need not.
        silence.unref();
      };
      if (cancellation.reason) return fail(cancellation.reason);
      stopListening = cancellation.onAbort((why) => controller?.abort(why));
      const { headersTimeoutMs, bodyTimeoutMs } = this;
      const handler: Dispatcher.DispatchHandler = {
        onRequestStart(c) {
          controller = c;
          // Aborted while the request waited for a connection.
          if (cancellation.reason) c.abort(cancellation.reason);
        },
        onResponseStart(_c, statusCode, responseHeaders) {
          if (statusCode < 200) return; // 1xx: informational, the real head follows
          markStage('dispatcher.engine-head');
          status = statusCode;
          const contentType = String(responseHeaders['content-type'] ?? 'application/json');
          relay.head({ status, contentType });
          if (!settled) awaitBody('first', headersTimeoutMs);
        },
        onResponseData(_c, chunk) {
          if (first) {
            first(status);
            first = undefined;
          }
          if (settled) return;
          // Each later chunk restarts the gap's timer rather than making one: the per-token
          // path allocates nothing for it.
          if (waiting === 'first') awaitBody('gap', bodyTimeoutMs);
          else silence?.refresh();
          relay.data(chunk);
          watch.data?.(chunk);
        },
        onResponseEnd() {
          if (settled) return;
          markStage('dispatcher.engine-end');
          relay.end(watch.end?.());
          settle(answered(status));
        },
        onResponseError(_c, err) {
          if (!settled) fail(err);
        },
      };
      try {
        const headers = this.headersFor(client);
        this.pool.dispatch({ path, method: 'POST', headers, body }, handler);
      } catch (err) {
        fail(err);
      }
    });
  }

  /**
   * The call's headers: the engine's own, then the client's (an engine's key never comes from
   * the client). vLLM reads them as the client sent them: `x-request-id` names the completion
   * (`chatcmpl-<id>`, vllm/entrypoints/openai/engine/serving.py `_base_request_id`),
   * `traceparent`/`tracestate` continue the client's trace (vllm/tracing.py
   * `extract_trace_headers`), `x-data-parallel-rank` picks the rank (`_get_data_parallel_rank`).
   */
  private headersFor(client: ClientContext): Readonly<Record<string, string>> {
    const { requestId, traceparent, tracestate, dataParallelRank } = client;
    if (
      requestId === undefined &&
      traceparent === undefined &&
      tracestate === undefined &&
      dataParallelRank === undefined
    )
      return this.headers;
    const headers: Record<string, string> = { ...this.headers };
    if (requestId !== undefined) headers[engineRequestHeaders.requestId] = requestId;
    if (traceparent !== undefined) headers[engineRequestHeaders.traceparent] = traceparent;
    if (tracestate !== undefined) headers[engineRequestHeaders.tracestate] = tracestate;
    if (dataParallelRank !== undefined)
      headers[engineRequestHeaders.dataParallelRank] = dataParallelRank;
    return headers;
  }

  /**
   * Ends a call that failed: the frame says whether it was cancelled, unreachable, timed out
   * or broke off.
   */
  private failed(
    err: unknown,
    headSent: boolean,
    relay: ReplyRelay,
    cancellation: Cancellation,
  ): CallOutcome {
    const why = cancellation.reason;
    if (why) {
      relay.error({ code: why.frameCode, message: `request cancelled: ${why.message}` });
      return 'cancelled';
    }
    // undici times the head only once the request runs on an open connection: the engine had
    // it and was (for a non-streamed request, most likely) still generating. Calling that
    // unreachable told clients to retry in 5 s and so run the same long generation again.
    // undici closed the connection, which makes vLLM abort the request and free its slot.
    if (!headSent && (err as { code?: unknown } | null)?.code === HEADERS_TIMEOUT) {
      relay.error({
        code: 'engine_timeout',
        message:
          `engine ${this.name} did not answer within ${this.headersTimeoutMs / 1000} s ` +
          '(ENGINE_HEADERS_TIMEOUT_MS; a non-streamed answer must be complete within it)',
      });
      return 'engine_timeout';
    }
    // The head came and no token after it: the prefill outlasted its bound. Not retryable,
    // as for a head that never came: the same prompt would take as long again.
    if (err instanceof EngineSilence && err.wait === 'first') {
      relay.error({
        code: 'engine_timeout',
        message:
          `engine ${this.name} sent no token within ${this.headersTimeoutMs / 1000} s of its ` +
          "response head (ENGINE_HEADERS_TIMEOUT_MS; a stream's prefill must end within it)",
      });
      return 'engine_timeout';
    }
    // A stream that stopped between tokens: the engine is stuck, not slow.
    if (err instanceof EngineSilence) {
      relay.error({
        code: 'engine_error',
        message:
          `engine ${this.name} failed mid-response: nothing for ${this.bodyTimeoutMs / 1000} s ` +
          'after the last chunk (ENGINE_BODY_TIMEOUT_MS)',
      });
      return 'engine_error';
    }
    const message = err instanceof Error ? err.message : String(err);
    relay.error(
      headSent
        ? { code: 'engine_error', message: `engine ${this.name} failed mid-response: ${message}` }
        : { code: 'engine_unreachable', message: `engine ${this.name} unreachable: ${message}` },
    );
    return headSent ? 'engine_error' : 'engine_unreachable';
  }

  close(): Promise<void> {
    return this.pool.close();
  }
}
