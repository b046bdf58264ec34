// Operations routes: liveness, readiness, metrics, the model list, and vLLM's /health and
// /version. None of them waits on Redis for longer than the command timeout, and /healthz and
// /health not at all.
import { readFileSync } from 'node:fs';
import type { Registry } from '@sluice/observability';
import type { FastifyInstance } from 'fastify';
import type { ModelCards } from '../model-cards.js';
import { readLeaders, type PoolQueue } from '../pool-queue.js';
import type { Routing } from '../routing.js';

export interface OpsRoutesOptions {
  replicaId: string;
  routing: Routing;
  /** The engines' own model cards, as far as this replica has read them. */
  cards: ModelCards;
  /** Connected, answering (see RedisProbe) and delivering replies (see ReplyHeartbeat). */
  redisUp(): boolean;
  /** The reply subscriber delivers this replica's heartbeat (false: deaf, the reason). */
  hearing?(): boolean;
  pools: ReadonlyMap<string, PoolQueue>;
  registry: Registry;
  /** True once the replica is shutting down: it must leave the load balancer at once. */
  draining(): boolean;
  /** False when GATEWAY_METRICS_PORT serves `/metrics` instead (then 404 here). */
  serveMetrics: boolean;
}

/**
 * Sluice's version: the root package.json's, as `sluice --version` prints it (the file sits
 * four levels up from both src/routes/ops.ts and dist/routes/ops.js, and is in the image).
 */
export function sluiceVersion(): string {
  try {
    const root = new URL('../../../../package.json', import.meta.url);
    return (JSON.parse(readFileSync(root, 'utf8')) as { version: string }).version;
  } catch {
    return 'unknown';
  }
}

export async function opsRoutes(app: FastifyInstance, opts: OpsRoutesOptions): Promise<void> {
  const { replicaId, routing, pools, registry, draining } = opts;
  app.get('/v1/models', async () => ({ object: 'list', data: opts.cards.list(routing.config) }));
  app.get('/healthz', async () => ({ status: 'ok', replica: replicaId }));
  // vLLM's health check (`@router.get("/health")` in
  // vllm/entrypoints/serve/instrumentator/health.py: 200 with an empty body, 503 once the
  // engine is dead), which load balancers written for vLLM probe to choose where to send
  // requests. For a gateway replica: 200 while it takes requests, from the start (Redis,
  // leaders and engines are shared by every replica: as for `/readyz?scope=replica`, they
  // must not take every replica out at once; this replica answers their absence with 503 +
  // Retry-After itself); 503 once it drains (SIGTERM), so a balancer moves on as from a vLLM
  // going away. Liveness stays `/healthz`, which is 200 through the drain. Open without a key.
  app.get('/health', async (_request, reply) => reply.code(draining() ? 503 : 200).send());
  // vLLM's `@router.get("/version")` (vllm/entrypoints/serve/instrumentator/basic.py) answers
  // `{"version": VLLM_VERSION}`. A gateway fronts pools whose engines may run different vLLM
  // versions, and the request names no model: it answers Sluice's own version, and says so.
  const version = sluiceVersion();
  app.get('/version', async () => ({ version, server: 'sluice' }));
  // Ready: Redis answers (and delivers this replica's replies: `replies`), every pool has a
  // leading dispatcher, and every model name is known.
  // `?scope=replica` asks only what is this replica's own: not draining. Redis, leaders and
  // engines are shared by every replica, so a Kubernetes readiness probe on the full answer
  // takes them all out of the Service at once, and clients get connection errors instead of
  // the 503 + Retry-After (no_leader, redis_unavailable) this replica would give them.
  app.get<{ Querystring: { scope?: 'replica' } }>(
    '/readyz',
    {
      schema: {
        querystring: {
          type: 'object',
          properties: { scope: { type: 'string', enum: ['replica'] } },
          additionalProperties: false,
        },
      },
    },
    async (request, reply) => {
      if (draining()) return reply.code(503).send({ draining: true });
      if (request.query.scope === 'replica') return reply.code(200).send({ draining: false });
      const redis = opts.redisUp();
      const leaders = redis
        ? (await readLeaders(pools, true)).map(([name, led]) => [name, led === true] as const)
        : [];
      const models = routing.known;
      const replies = opts.hearing?.() ?? true;
      const ready = redis && models && leaders.every(([, ok]) => ok);
      return reply
        .code(ready ? 200 : 503)
        .send({ redis, replies, leaders: Object.fromEntries(leaders), models });
    },
  );
  if (opts.serveMetrics)
    app.get('/metrics', async (_request, reply) =>
      reply.type(registry.contentType).send(await registry.metrics()),
    );
}
