// What a held request needs from its replica: timings, the pool's queue, cancel, metrics,
// and leaving the reply router when done.
import type { GatewayMetrics } from '@sluice/observability';
import type { HeldRequestHooks } from './held-request.js';
import type { PoolQueue } from './pool-queue.js';
import type { ReplyRouter } from './replies.js';

export interface HeldHooksDeps {
  heartbeatSeconds: number;
  slowClientBytes: number;
  slowClientStallSeconds: number;
  now(): number;
  metrics: GatewayMetrics;
  replies: ReplyRouter;
  publishCancel(jobId: string, reason: string): void;
}

export function heldHooks(
  deps: HeldHooksDeps,
  pool: PoolQueue,
  model: string,
  tenant?: string,
): HeldRequestHooks {
  const { metrics, replies, now } = deps;
  return {
    heartbeatMs: deps.heartbeatSeconds * 1000,
    maxParkMs: pool.pool.maxParkSeconds * 1000,
    slowClientBytes: deps.slowClientBytes,
    slowClientStallMs: deps.slowClientStallSeconds * 1000,
    now,
    removeQueued: (jobId) => pool.removeQueued(jobId, tenant),
    jobKey: (jobId) => pool.jobKey(jobId),
    cancel: deps.publishCancel,
    retryAfter: () => pool.retryAfter(),
    onHeartbeat: () => metrics.heartbeats.inc(),
    onStarted: (_held, wait) => {
      metrics.parked.dec({ model });
      metrics.queueWait.observe({ model }, wait);
    },
    onFirstByte: (held) => metrics.ttft.observe({ model }, (now() - held.receivedAt) / 1000),
    onRefused: (_held, r) => {
      metrics.rejected.inc({ model, reason: r.reason });
      if (tenant !== undefined) metrics.tenantRejected.inc({ tenant, reason: r.reason });
    },
    onDone: (held, wasQueued) => {
      if (wasQueued) metrics.parked.dec({ model });
      metrics.holding.dec();
      replies.forget(held.jobId);
    },
  };
}
