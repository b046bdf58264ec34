// The BullMQ job a gateway adds for a gated request, and its validation on the way out of
// Redis: the dispatcher trusts nothing it reads back.
import { ProtocolError } from './errors.js';
import { isTokenCount } from './frames.js';
import { isKeyPart, keyPartRule } from './keys.js';

export const completionPaths = ['/v1/chat/completions', '/v1/completions'] as const;
export type CompletionPath = (typeof completionPaths)[number];

export interface JobPayload {
  /** Wire version; bump on an incompatible change. */
  v: 1;
  /**
   * Raw request body as the client sent it, UTF-8 text. A gateway sends `bodyBase64` instead
   * (one of the two is present): BullMQ carries job data as JSON, and a body as base64 is
   * stringified and parsed 1.2x (1 KiB) to 2.3x (1 MiB) faster than as text, which JSON
   * escapes (docs/performance.md, "The body as bytes").
   */
  body?: string;
  /** Raw request body as the client sent it, base64. */
  bodyBase64?: string;
  /**
   * The body is not in the payload: it is in a key of its own (KeySpace.jobBody), raw bytes as
   * the client sent them. A gateway does this from SLUICE_BODY_KEY_MIN_BYTES on, where the bytes cost
   * one command to write (inside the admission script) and one round trip to read back, and
   * base64 inside BullMQ's JSON would cost milliseconds in both processes
   * (docs/performance.md, "The body as bytes").
   */
  bodyInKey?: true;
  path: CompletionPath;
  stream: boolean;
  /** Gateway replica holding the client: frames go to its reply channel. */
  replica: string;
  /** Unix ms when the gateway enqueued the request. */
  enqueuedAt: number;
  /** Unix ms after which the request must not be started (the client has been answered 503). */
  deadline: number;
  /** 0 = default; higher runs first. */
  priority: number;
  /** Client's `max_tokens` / `max_completion_tokens`, when it sent one. */
  maxTokens?: number;
  /** The gateway's estimate of the prompt's tokens; absent counts as 0 (a short prompt). */
  promptTokens?: number;
  /**
   * Engine requests the job becomes: `n` x the prompts of a `/v1/completions` batch (vLLM V1
   * runs each as a request of its own, vllm/v1/engine/async_llm.py `add_request`). Absent: 1.
   * A dispatcher of the previous version ignores it and counts 1 (update dispatchers first).
   */
  sequences?: number;
  tenant?: string;
  /** The client asked not to be degraded (`x-sluice-degrade: off`) and the pool allows it. */
  optOut?: boolean;
  /**
   * The gateway reads token counts in the end frame. A gateway of the previous version sets
   * none and gets an end frame without them (it would refuse them), so gateways and
   * dispatchers can be updated in either order.
   */
  endCounts?: boolean;
  /**
   * What the engine is to be told of the client's request, sent as request headers on the
   * engine call (`engineRequestHeaders`), as the client would have sent them to vLLM itself.
   * A dispatcher of the previous version ignores them (the payload stays version 1).
   * `requestId`: the gateway's request id (the `x-request-id` it answers with).
   */
  requestId?: string;
  /** The client's W3C `traceparent`, when well-formed (`isTraceparent`). */
  traceparent?: string;
  /** The client's W3C `tracestate`, when well-formed (`isTracestate`) and beside a `traceparent`. */
  tracestate?: string;
  /** The client's `x-data-parallel-rank`, decimal digits as the header had them (`isDataParallelRank`). */
  dataParallelRank?: string;
}

/**
 * The request headers a job's engine call carries from the client, by payload field. vLLM reads
 * each (checked in vllm/entrypoints/openai/engine/serving.py, `serving_engine.py` in older
 * releases): `x-request-id` in `_base_request_id` (the completion's id becomes
 * `chatcmpl-<id>` / `cmpl-<id>`); `traceparent` and `tracestate` in `_get_trace_headers`
 * (vllm/tracing.py `extract_trace_headers` / `contains_trace_headers`, W3C trace context for
 * OpenTelemetry); `x-data-parallel-rank` in `_get_data_parallel_rank` (the data-parallel rank
 * the request runs on, range-checked in vllm/v1/engine/input_processor.py).
 */
export const engineRequestHeaders = {
  requestId: 'x-request-id',
  traceparent: 'traceparent',
  tracestate: 'tracestate',
  dataParallelRank: 'x-data-parallel-rank',
} as const;

/** Longest request id kept: a UUID, a ULID or a W3C trace id fit with room to spare. */
export const MAX_REQUEST_ID_LENGTH = 128;
// Letters, digits and `.`, `_`, `-`, `:`: nothing a log reader or a header could misread.
const REQUEST_ID = new RegExp(`^[A-Za-z0-9._:-]{1,${MAX_REQUEST_ID_LENGTH}}$`);

/** A request id Sluice keeps, logs, echoes and sends on. */
export function isRequestId(value: unknown): value is string {
  return typeof value === 'string' && REQUEST_ID.test(value);
}

/** Longest `traceparent` taken: version 00 is 55 characters; a later version may add fields. */
export const MAX_TRACEPARENT_LENGTH = 256;
// W3C Trace Context (https://www.w3.org/TR/trace-context/#traceparent-header):
// version-traceid-parentid-flags in lowercase hex, version ff invalid, an all-zero trace or
// parent id invalid; a version after 00 may go on after a `-`. What OpenTelemetry's propagator
// (vLLM's) accepts, but no blanks around it.
const TRACEPARENT =
  /^(?!ff)[0-9a-f]{2}-(?!0{32}-)[0-9a-f]{32}-(?!0{16}-)[0-9a-f]{16}-[0-9a-f]{2}(?:-[\x21-\x7e]*)?$/;

/** A well-formed W3C `traceparent`. */
export function isTraceparent(value: unknown): value is string {
  return (
    typeof value === 'string' &&
    value.length <= MAX_TRACEPARENT_LENGTH &&
    TRACEPARENT.test(value) &&
    // Version 00 has exactly four fields.
    (value.length === 55 || !value.startsWith('00'))
  );
}

/**
 * Longest `tracestate` taken: the 512 characters W3C asks every vendor to pass on; a longer one
 * is dropped whole (W3C lets a vendor discard it), not cut.
 */
export const MAX_TRACESTATE_LENGTH = 512;
// https://www.w3.org/TR/trace-context/#tracestate-header: up to 32 comma-separated members
// (an empty one allowed), each key=value; a key lowercase (`tenant@system` for multi-tenant
// vendors), a value up to 256 printable characters without `,` and `=`, not ending in a blank.
// Written so that each run of blanks has one place to go: no backtracking blow-up.
const TRACESTATE_KEY =
  '(?:[a-z][a-z0-9_*/-]{0,255}|[a-z0-9][a-z0-9_*/-]{0,240}@[a-z][a-z0-9_*/-]{0,13})';
const TRACESTATE_VALUE =
  '[\\x20-\\x2b\\x2d-\\x3c\\x3e-\\x7e]{0,255}[\\x21-\\x2b\\x2d-\\x3c\\x3e-\\x7e]';
const TRACESTATE_MEMBER = `(?:${TRACESTATE_KEY}=${TRACESTATE_VALUE}[ \\t]*)?`;
const TRACESTATE = new RegExp(
  `^[ \\t]*${TRACESTATE_MEMBER}(?:,[ \\t]*${TRACESTATE_MEMBER}){0,31}$`,
);

/** A well-formed, non-empty W3C `tracestate` of at most `MAX_TRACESTATE_LENGTH` characters. */
export function isTracestate(value: unknown): value is string {
  return (
    typeof value === 'string' &&
    value.length > 0 &&
    value.length <= MAX_TRACESTATE_LENGTH &&
    TRACESTATE.test(value)
  );
}

// A non-negative integer in decimal digits (vLLM reads it with Python's int()), nine at most.
const DATA_PARALLEL_RANK = /^[0-9]{1,9}$/;

/** A data-parallel rank as `x-data-parallel-rank` carries it: a non-negative integer. */
export function isDataParallelRank(value: unknown): value is string {
  return typeof value === 'string' && DATA_PARALLEL_RANK.test(value);
}

/**
 * How long a body key outlives its job's park limit: a job taken just before its deadline
 * still finds its body when it runs.
 */
export const BODY_KEY_GRACE_MS = 60_000;

/**
 * The request body a payload carries, as the engine is to get it; for `bodyInKey`, none: the
 * caller reads KeySpace.jobBody.
 */
export function jobBody(payload: JobPayload): string | Buffer {
  return payload.bodyBase64 !== undefined
    ? Buffer.from(payload.bodyBase64, 'base64')
    : (payload.body ?? '');
}

function fail(field: string, expected: string, value: unknown): never {
  const shown =
    typeof value === 'string' && value.length > 40
      ? `${JSON.stringify(value.slice(0, 40))}...`
      : JSON.stringify(value);
  throw new ProtocolError(
    `job payload field ${field} must be ${expected}, got ${shown ?? typeof value}`,
  );
}

const isFiniteNumber = (v: unknown): v is number => typeof v === 'number' && Number.isFinite(v);

/** Checks a payload read back from Redis; throws ProtocolError naming the first bad field. */
export function validateJobPayload(value: unknown): JobPayload {
  if (typeof value !== 'object' || value === null || Array.isArray(value))
    fail('(root)', 'an object', value);
  const p = value as Record<string, unknown>;
  if (p['v'] !== 1) fail('v', '1', p['v']);
  const carried = [p['body'], p['bodyBase64'], p['bodyInKey']].filter((v) => v !== undefined);
  if (carried.length !== 1)
    fail('body', 'a string, or absent beside a bodyBase64 string or bodyInKey', p['body']);
  if (p['bodyInKey'] !== undefined && p['bodyInKey'] !== true)
    fail('bodyInKey', 'true', p['bodyInKey']);
  if (p['body'] !== undefined && typeof p['body'] !== 'string') fail('body', 'a string', p['body']);
  if (p['bodyBase64'] !== undefined && typeof p['bodyBase64'] !== 'string')
    fail('bodyBase64', 'a string', p['bodyBase64']);
  if (!completionPaths.includes(p['path'] as CompletionPath))
    fail('path', completionPaths.join(' or '), p['path']);
  if (typeof p['stream'] !== 'boolean') fail('stream', 'a boolean', p['stream']);
  if (typeof p['replica'] !== 'string' || !isKeyPart(p['replica']))
    fail('replica', `a non-empty string of ${keyPartRule}`, p['replica']);
  if (!isFiniteNumber(p['enqueuedAt'])) fail('enqueuedAt', 'a number', p['enqueuedAt']);
  if (!isFiniteNumber(p['deadline'])) fail('deadline', 'a number', p['deadline']);
  if (!Number.isInteger(p['priority']) || (p['priority'] as number) < 0)
    fail('priority', 'an integer >= 0', p['priority']);
  if (
    p['maxTokens'] !== undefined &&
    (!Number.isInteger(p['maxTokens']) || (p['maxTokens'] as number) < 0)
  )
    fail('maxTokens', 'an integer >= 0', p['maxTokens']);
  // Charged to the tenant's fair-share counter at release: a count past 2^53 would stay in it.
  if (p['promptTokens'] !== undefined && !isTokenCount(p['promptTokens']))
    fail('promptTokens', 'an integer >= 0', p['promptTokens']);
  // Counted against the engine's cap: anything but a whole number >= 1 would corrupt the count.
  if (
    p['sequences'] !== undefined &&
    (!Number.isSafeInteger(p['sequences']) || (p['sequences'] as number) < 1)
  )
    fail('sequences', 'an integer >= 1', p['sequences']);
  if (p['tenant'] !== undefined && typeof p['tenant'] !== 'string')
    fail('tenant', 'a string', p['tenant']);
  if (p['optOut'] !== undefined && typeof p['optOut'] !== 'boolean')
    fail('optOut', 'a boolean', p['optOut']);
  if (p['endCounts'] !== undefined && typeof p['endCounts'] !== 'boolean')
    fail('endCounts', 'a boolean', p['endCounts']);
  // Sent as header values: anything else could not be sent, or would say something else.
  if (p['requestId'] !== undefined && !isRequestId(p['requestId']))
    fail('requestId', `1 to ${MAX_REQUEST_ID_LENGTH} of A-Z a-z 0-9 . _ - :`, p['requestId']);
  if (p['traceparent'] !== undefined && !isTraceparent(p['traceparent']))
    fail('traceparent', 'a W3C traceparent', p['traceparent']);
  if (p['tracestate'] !== undefined && !isTracestate(p['tracestate']))
    fail(
      'tracestate',
      `a W3C tracestate of at most ${MAX_TRACESTATE_LENGTH} characters`,
      p['tracestate'],
    );
  if (p['tracestate'] !== undefined && p['traceparent'] === undefined)
    fail('tracestate', 'absent without a traceparent', p['tracestate']);
  if (p['dataParallelRank'] !== undefined && !isDataParallelRank(p['dataParallelRank']))
    fail('dataParallelRank', 'a string of 1 to 9 decimal digits', p['dataParallelRank']);
  return p as unknown as JobPayload;
}

/**
 * Where a job stands within its priority class: long prompts whose aging limit passed go
 * first, then short prompts, then long ones (docs/broker.md, "Order").
 */
export type QueueLevel = 'aged' | 'short' | 'long';

const LEVELS: Record<QueueLevel, number> = { aged: 0, short: 1, long: 2 };

/** BullMQ's highest priority value. */
export const BULL_MAX_PRIORITY = 2_097_152;

/**
 * Maps Sluice priority (0 = default, `maxPriority` = most urgent) and the job's level onto
 * BullMQ's priority, in which a lower value is served first and FIFO holds within a value.
 * Every job is prioritised (>= 1): BullMQ serves its plain wait list (priority 0) before any
 * prioritised job, so an aged long prompt could not go ahead of short ones there. A class
 * takes three values; `maxPriority` must be at most (2,097,152 - 3) / 3.
 */
export function bullPriority(priority: number, maxPriority: number, level: QueueLevel): number {
  const urgency = maxPriority - Math.min(priority, maxPriority);
  return urgency * 3 + LEVELS[level] + 1;
}

/**
 * Length of each queue's BullMQ events stream (`<queue>:events`). Every add, take and
 * completion appends to it and BullMQ cannot switch it off, but Sluice reads no queue events
 * (replies travel on pub/sub): the stream is only memory, 10,000 entries per pool by default.
 * BullMQ trims approximately (`XADD MAXLEN ~`), in whole nodes of `stream-node-max-entries`
 * (100 by default), so 100 keeps one or two nodes: a short tail left for a person debugging
 * with XRANGE. BullMQ's Queue stores it in the queue's meta hash, where its scripts read it:
 * the gateway's and the dispatcher's Queue must pass the same value.
 */
export const QUEUE_EVENTS_MAX_LEN = 100;
