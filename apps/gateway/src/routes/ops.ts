// Operations routes: liveness, readiness, metrics, and the model list.
import type { SluiceConfig } from '@sluice/config';
import type { Registry } from '@sluice/observability';
import { redisHealthy, type Redis } from '@sluice/redis';
import type { FastifyInstance } from 'fastify';
import type { PoolQueue } from '../pool-queue.js';

export interface OpsRoutesOptions {
  replicaId: string;
  config: SluiceConfig;
  redis: Redis;
  pools: ReadonlyMap<string, PoolQueue>;
  registry: Registry;
  /** True once the replica is shutting down: it must leave the load balancer at once. */
  draining(): boolean;
}

export async function opsRoutes(app: FastifyInstance, opts: OpsRoutesOptions): Promise<void> {
  const { replicaId, config, redis, pools, registry, draining } = opts;
  app.get('/v1/models', async () => ({
    object: 'list',
    data: [...config.pools.flatMap((p) => p.models), ...config.passthrough.map((p) => p.model)].map(
      (id) => ({ id, object: 'model', created: 0, owned_by: 'sluice' }),
    ),
  }));
  app.get('/healthz', async () => ({ status: 'ok', replica: replicaId }));
  app.get('/readyz', async (_request, reply) => {
    if (draining()) return reply.code(503).send({ draining: true });
    const redisOk = await redisHealthy(redis);
    const leaders = redisOk
      ? await Promise.all(
          [...pools.values()].map(async (p) => [p.pool.name, await p.hasLeader()] as const),
        )
      : [];
    const ready = redisOk && leaders.every(([, ok]) => ok);
    return reply
      .code(ready ? 200 : 503)
      .send({ redis: redisOk, leaders: Object.fromEntries(leaders) });
  });
  app.get('/metrics', async (_request, reply) =>
    reply.type(registry.contentType).send(await registry.metrics()),
  );
}
