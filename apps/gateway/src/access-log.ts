// The end of every completion request: one access-log line and the response metrics (status
// code, duration, tokens; per tenant when tenants are configured). Called exactly once per
// request by whichever path answered it: a refusal, a held request, a pass-through.
//
// The line names the request and its numbers only: never a prompt, a completion or a key
// (the fields below are all there is; the logger's redaction is the net under that rule).
import type { GatewayMetrics } from '@sluice/observability';
import { completionPaths, type Refusal } from '@sluice/protocol';
import type { FastifyBaseLogger, FastifyRequest } from 'fastify';

/** One finished completion request: the access-log line's fields, in its order. */
export interface RequestEnd {
  /** `x-request-id`: the client's when it was valid, else generated. */
  id: string;
  /** The BullMQ job id of a gated request (the dispatcher logs it). */
  jobId?: string;
  /** A configured model name, or `unknown`. */
  model: string;
  pool?: string;
  /** Routed to a pass-through backend (no pool). */
  passthrough?: true;
  tenant?: string;
  stream?: boolean;
  /** See HeldRequest.status: the status the answer amounts to; 499 when the client left. */
  status: number;
  /** The refusal reason, when Sluice refused or ended the request (or `engine_error`). */
  reason?: string;
  /**
   * The refusal's full message, where the client was told a fixed one instead: an engine
   * failure with tenants and SLUICE_TENANT_ENGINE_DETAILS off (refuse.ts).
   */
  detail?: string;
  queueWaitMs?: number;
  /** Arrival to the first byte of the engine's body written to the client. */
  ttftMs?: number;
  /** Arrival to the last byte written (or the refusal). */
  durationMs: number;
  promptTokens?: number;
  completionTokens?: number;
  /** The prompt count is the gateway's estimate: the engine reported no usage. */
  promptTokensEstimated?: boolean;
}

export type RequestEnded = (end: RequestEnd) => void;

/**
 * The recorder every path calls. The access log is a child logger made once (its binding
 * `kind: "access"` is serialized once, not per line); `enabled` false (SLUICE_ACCESS_LOG=off)
 * keeps the metrics and drops the line.
 */
export function requestEnded(
  log: FastifyBaseLogger,
  metrics: GatewayMetrics,
  enabled: boolean,
): RequestEnded {
  const access = log.child({ kind: 'access' });
  const { responses, requestDuration, tenantResponses, tokens } = metrics;
  return (end) => {
    const model = end.model;
    responses.inc({ model, code: end.status });
    requestDuration.observe({ model }, end.durationMs / 1000);
    if (end.tenant !== undefined) tenantResponses.inc({ tenant: end.tenant, code: end.status });
    if (end.promptTokens !== undefined) tokens.inc({ model, kind: 'prompt' }, end.promptTokens);
    if (end.completionTokens !== undefined)
      tokens.inc({ model, kind: 'completion' }, end.completionTokens);
    if (enabled) access.info(end, 'request');
  };
}

const COMPLETION_PATHS: ReadonlySet<string | undefined> = new Set(completionPaths);

/** A request to a completion route: the requests the access log and metrics are about. */
export function isCompletionRequest(request: FastifyRequest): boolean {
  return request.method === 'POST' && COMPLETION_PATHS.has(request.routeOptions.url);
}

/**
 * The end of a request refused before it was held (Fastify answers it). `stream`: what its
 * body asked, once the body was read and understood.
 */
export function refusedEnd(
  request: FastifyRequest,
  model: string,
  r: Refusal,
  now: number,
  pool?: string,
  stream?: boolean,
): RequestEnd {
  return {
    id: request.id,
    model,
    pool,
    tenant: request.tenant?.name,
    stream,
    status: r.status,
    reason: r.reason,
    durationMs: now - request.arrivedAt,
  };
}
