// Every way Sluice refuses or ends a request, in one table: the HTTP status, the OpenAI
// error `type`, whether retrying can help, and the `Retry-After` used when nothing better
// is known. `x-sluice-reject-reason`, the `reason` label of `sluice_rejected_total`, the
// `code` of error bodies and the `code` of error frames all take these names, and every
// place that answers a refusal reads this table instead of choosing a status itself.
//
// Every 503 and 429 is retryable and carries `Retry-After` (RFC 9110 §10.2.3).

export type OpenAIErrorType =
  'invalid_request_error' | 'authentication_error' | 'rate_limit_error' | 'server_error';

export interface RefusalKind {
  readonly status: number;
  readonly type: OpenAIErrorType;
  /** Seconds for `Retry-After` when the caller has no estimate; absent: not retryable. */
  readonly retryAfter?: number;
}

const retry = (status: 503 | 429, retryAfter: number): RefusalKind => ({
  status,
  type: status === 429 ? 'rate_limit_error' : 'server_error',
  retryAfter,
});
const invalid = (status: number): RefusalKind => ({ status, type: 'invalid_request_error' });

export const refusalKinds = {
  queue_full: retry(503, 5),
  park_timeout: retry(503, 5),
  long_backlog: retry(503, 5),
  no_leader: retry(503, 5),
  /** An operator drains the pool (`sluice pool drain`): it finishes what is queued, takes nothing new. */
  pool_draining: retry(503, 30),
  redis_unavailable: retry(503, 5),
  /**
   * The queued job vanished from Redis (restarted empty, failed over), or a dispatcher failed it
   * without a frame (its data unreadable): it will never run.
   */
  queue_lost: retry(503, 1),
  engine_unreachable: retry(503, 5),
  /** This replica is shutting down (rolling update): another replica will take the retry. */
  shutting_down: retry(503, 1),
  /**
   * The dispatcher that had the request died or lost it: the gateway heard nothing from it past
   * the silence timeout, or the next leader found the job it left. It may have reached the
   * engine, so it is not run again.
   */
  dispatcher_lost: retry(503, 1),
  engine_error: { status: 502, type: 'server_error' },
  /**
   * The engine had the request but sent no head within ENGINE_HEADERS_TIMEOUT_MS, or no first
   * body byte within it after the head: for a non-streamed request the whole generation took
   * longer (vLLM sends its head with the answer), for a stream its prefill did. Not retryable
   * as a 503 would be: the same request would most likely take as long again, on GPU time
   * spent twice.
   */
  engine_timeout: { status: 504, type: 'server_error' },
  frame_lost: { status: 502, type: 'server_error' },
  internal_error: { status: 500, type: 'server_error' },
  /** 499 is never sent (nobody is listening); it labels metrics and frames. */
  cancelled: invalid(499),
  slow_client: invalid(499),
  bad_request: invalid(400),
  not_found: invalid(404),
  method_not_allowed: invalid(405),
  model_not_found: invalid(404),
  request_timeout: invalid(408),
  body_too_large: invalid(413),
  unsupported_media_type: invalid(415),
  headers_too_large: invalid(431),
  /** The tenant has `maxQueued` requests queued in this pool already. */
  tenant_queue_full: retry(429, 5),
  /** Missing or unknown `Authorization: Bearer` key (tenants configured). */
  invalid_api_key: invalid(401),
  /**
   * The client's address presented too many wrong keys (GATEWAY_AUTH_FAILURE_LIMIT within
   * GATEWAY_AUTH_FAILURE_WINDOW_SECONDS): its key is not checked until the window ends, which
   * `Retry-After` says.
   */
  auth_throttled: retry(429, 60),
} as const satisfies Record<string, RefusalKind>;

export type RejectReason = keyof typeof refusalKinds;

/** Status per reason (the table's first column). */
export const rejectReasons = Object.fromEntries(
  Object.entries(refusalKinds).map(([reason, kind]) => [reason, kind.status]),
) as { readonly [R in RejectReason]: (typeof refusalKinds)[R]['status'] };

export function isRejectReason(value: string): value is RejectReason {
  return Object.hasOwn(refusalKinds, value);
}

/** A refusal ready to answer: the reason's status, a message, and `Retry-After` if retryable. */
export interface Refusal {
  readonly status: number;
  readonly reason: RejectReason;
  readonly type: OpenAIErrorType;
  readonly message: string;
  readonly retryAfter?: number;
}

/**
 * Builds a refusal from the table. `retryAfter` overrides the reason's default (an estimate
 * from the drain rate, say) and is ignored for a reason that is not retryable.
 */
export function refusal(reason: RejectReason, message: string, retryAfter?: number): Refusal {
  const kind: RefusalKind = refusalKinds[reason];
  if (kind.retryAfter === undefined)
    return { status: kind.status, type: kind.type, reason, message };
  return {
    status: kind.status,
    type: kind.type,
    reason,
    message,
    retryAfter: Math.max(1, Math.ceil(retryAfter ?? kind.retryAfter)),
  };
}
