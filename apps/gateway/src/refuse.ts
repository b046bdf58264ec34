// Every refusal in one shape: the OpenAI error body, `x-sluice-reject-reason`, and
// `Retry-After` where retrying can help. Statuses, types and defaults come from the refusal
// table in `@sluice/protocol`; this module only writes them.
import { openaiErrorBody } from '@sluice/openai';
import { sluiceHeaders, type Refusal, type RejectReason } from '@sluice/protocol';
import type { ServerResponse } from 'node:http';

export { refusal, type Refusal } from '@sluice/protocol';

/**
 * What a client whose queued job vanished is told. Not only Redis loses a queued job: a
 * dispatcher fails one whose data it cannot read (so no reply address it can trust), or that
 * it failed to place, without a frame, and its gateway finds it gone the same way.
 */
export const QUEUE_LOST_MESSAGE =
  'the queued request is no longer in Redis (lost in a Redis restart or failover, or failed by a dispatcher that could not read or place it); it will not run';

/**
 * What a tenant is told of an engine failure when the engine is not theirs to see
 * (SLUICE_TENANT_ENGINE_DETAILS off): the full message names the engine (by default its host
 * and port) and undici's cause (an address again), which the access log keeps as `detail`.
 */
const ENGINE_FAILURE_MESSAGES: Partial<Record<RejectReason, string>> = {
  engine_unreachable: 'the engine could not be reached; retry later',
  engine_error: 'the engine failed before its answer was complete',
  engine_timeout: 'the engine took longer than the gateway waits for an answer',
};

/** `r` as a client that may not see engine details is told it: itself unless it names one. */
export function withoutEngineDetails(r: Refusal): Refusal {
  const message = ENGINE_FAILURE_MESSAGES[r.reason];
  return message === undefined ? r : { ...r, message };
}

export function refusalHeaders(r: Refusal): Record<string, string> {
  const headers: Record<string, string> = {
    'content-type': 'application/json',
    [sluiceHeaders.rejectReason]: r.reason,
  };
  if (r.retryAfter !== undefined) headers['retry-after'] = String(r.retryAfter);
  return headers;
}

export function refusalBody(r: Refusal): string {
  return openaiErrorBody(r.message, r.type, r.reason, null);
}

/** Answers a client that has not been answered yet. */
export function writeRefusal(res: ServerResponse, r: Refusal): void {
  if (res.headersSent || res.destroyed) return;
  // 499 (client closed) is never sent: there is nobody to send it to.
  res.writeHead(r.status === 499 ? 503 : r.status, refusalHeaders(r));
  res.end(refusalBody(r));
}
