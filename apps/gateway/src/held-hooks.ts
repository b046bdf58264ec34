// What a held request needs from its replica: timings, the pool's queue, cancel, metrics,
// and leaving the reply router when done.
import type { GatewayMetrics } from '@sluice/observability';
import type { JobPayload } from '@sluice/protocol';
import type { RequestEnd, RequestEnded } from './access-log.js';
import type { HeldRequest, HeldRequestHooks } from './held-request.js';
import type { PoolQueue } from './pool-queue.js';
import type { ReplyRouter } from './replies.js';

export interface HeldHooksDeps {
  heartbeatSeconds: number;
  slowClientBytes: number;
  slowClientStallSeconds: number;
  /** See HeldRequestHooks.engineDetails. */
  engineDetails: boolean;
  now(): number;
  metrics: GatewayMetrics;
  replies: ReplyRouter;
  publishCancel(jobId: string, reason: string): void;
  ended: RequestEnded;
}

/** What the access log (and the removal of its job) needs of a held request beyond HeldRequest. */
export interface HeldInfo {
  /** `x-request-id`. */
  id: string;
  model: string;
  tenant?: string;
  /** The gateway's estimate, counted when the engine reports no usage. */
  promptTokens: number;
  /** Its body went into a key of its own. */
  bodyInKey?: JobPayload['bodyInKey'];
}

export function heldHooks(deps: HeldHooksDeps, pool: PoolQueue, info: HeldInfo): HeldRequestHooks {
  const { metrics, replies, now } = deps;
  const { model, tenant } = info;
  return {
    heartbeatMs: deps.heartbeatSeconds * 1000,
    maxParkMs: pool.pool.maxParkSeconds * 1000,
    slowClientBytes: deps.slowClientBytes,
    slowClientStallMs: deps.slowClientStallSeconds * 1000,
    engineDetails: deps.engineDetails,
    now,
    removeQueued: (jobId) => pool.removeQueued(jobId, { tenant, bodyInKey: info.bodyInKey }),
    jobKey: (jobId) => pool.jobKey(jobId),
    cancel: deps.publishCancel,
    retryAfter: () => pool.retryAfter(),
    onHeartbeat: () => metrics.heartbeats.inc(),
    onStarted: (_held, wait) => {
      metrics.parked.dec({ model });
      metrics.queueWait.observe({ model }, wait);
    },
    // Streams only: a non-streamed answer's first byte comes with the whole generation, which
    // sluice_request_duration_seconds already counts (the metric's definition says more).
    onFirstByte: (held) => {
      if (held.stream)
        metrics.ttft.observe({ model }, (held.firstByteAt! - held.receivedAt) / 1000);
    },
    onRefused: (_held, r) => {
      metrics.rejected.inc({ model, reason: r.reason });
      if (tenant !== undefined) metrics.tenantRejected.inc({ tenant, reason: r.reason });
    },
    onDone: (held, wasQueued) => {
      if (wasQueued) metrics.parked.dec({ model });
      metrics.holding.dec();
      replies.forget(held.jobId);
      deps.ended(heldEnd(held, pool.pool.name, info, now()));
    },
  };
}

/**
 * The end of a held request. Tokens are counted for answers the engine gave whole (2xx,
 * ended by the end frame): the engine's usage when it sent one, else a stream's counted
 * events with the gateway's prompt estimate.
 */
export function heldEnd(held: HeldRequest, pool: string, info: HeldInfo, now: number): RequestEnd {
  const end: RequestEnd = {
    id: info.id,
    jobId: held.jobId,
    model: info.model,
    pool,
    tenant: info.tenant,
    stream: held.stream,
    status: held.status,
    reason: held.reason,
    detail: held.detail,
    queueWaitMs: held.queueWaitMs,
    ttftMs: held.firstByteAt === undefined ? undefined : held.firstByteAt - held.receivedAt,
    durationMs: now - held.receivedAt,
  };
  // A 2xx without a reason ended with the end frame (every other end sets a reason).
  if (held.status >= 200 && held.status < 300 && held.reason === undefined) {
    // A dispatcher of the previous version sends no counts.
    const tokens = held.tokens;
    end.completionTokens = tokens?.completionTokens;
    end.promptTokens = tokens?.promptTokens ?? info.promptTokens;
    if (tokens?.promptTokens === undefined) end.promptTokensEstimated = true;
  }
  return end;
}
