// Operations routes: liveness, readiness, metrics, and the model list. None of them waits
// on Redis for longer than the command timeout, and /healthz not at all.
import type { Registry } from '@sluice/observability';
import type { FastifyInstance } from 'fastify';
import type { ModelCards } from '../model-cards.js';
import type { PoolQueue } from '../pool-queue.js';
import type { Routing } from '../routing.js';

export interface OpsRoutesOptions {
  replicaId: string;
  routing: Routing;
  /** The engines' own model cards, as far as this replica has read them. */
  cards: ModelCards;
  /** Connected and answering (see RedisProbe). */
  redisUp(): boolean;
  pools: ReadonlyMap<string, PoolQueue>;
  registry: Registry;
  /** True once the replica is shutting down: it must leave the load balancer at once. */
  draining(): boolean;
  /** False when GATEWAY_METRICS_PORT serves `/metrics` instead (then 404 here). */
  serveMetrics: boolean;
}

export async function opsRoutes(app: FastifyInstance, opts: OpsRoutesOptions): Promise<void> {
  const { replicaId, routing, pools, registry, draining } = opts;
  app.get('/v1/models', async () => ({ object: 'list', data: opts.cards.list(routing.config) }));
  app.get('/healthz', async () => ({ status: 'ok', replica: replicaId }));
  // Ready: Redis answers, every pool has a leading dispatcher, and every model name is known.
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
        ? await Promise.all(
            [...pools.values()].map(
              async (p) => [p.pool.name, await p.hasLeader().catch(() => false)] as const,
            ),
          )
        : [];
      const models = routing.known;
      const ready = redis && models && leaders.every(([, ok]) => ok);
      return reply
        .code(ready ? 200 : 503)
        .send({ redis, leaders: Object.fromEntries(leaders), models });
    },
  );
  if (opts.serveMetrics)
    app.get('/metrics', async (_request, reply) =>
      reply.type(registry.contentType).send(await registry.metrics()),
    );
}
