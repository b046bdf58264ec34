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
