// `sluice gateway`: one stateless replica of the HTTP edge.
import { randomUUID } from 'node:crypto';
import { ConfigError, createRouter, loadConfig, type SluiceConfig } from '@sluice/config';
import {
  collectDefaultMetrics,
  gatewayMetrics,
  loggerOptions,
  Registry,
} from '@sluice/observability';
import { keySpace } from '@sluice/protocol';
import { createRedis, redisReady } from '@sluice/redis';
import Fastify, { LogController, type FastifyReply } from 'fastify';
import { cancelPublisher } from './cancels.js';
import { discoverModels } from './discovery.js';
import { installErrorHandler } from './errors.js';
import { HeldClients } from './held-clients.js';
import { heldHooks, type HeldHooksDeps } from './held-hooks.js';
import { Passthrough } from './passthrough.js';
import { PoolQueue } from './pool-queue.js';
import { refusalBody, refusalHeaders, type Refusal } from './refuse.js';
import { ReplicaHeartbeat } from './replica.js';
import { ReplyRouter } from './replies.js';
import { acceptRawJson, completionRoutes } from './routes/completions.js';
import { opsRoutes } from './routes/ops.js';

export interface Gateway {
  readonly replicaId: string;
  readonly url: string;
  /** Drains (SHUTDOWN_DRAIN_SECONDS at most, less when nothing is held), then closes. */
  close(): Promise<void>;
  /** Ends a drain in progress now (a second signal). */
  cutDrainShort(): void;
}

export async function startGateway(loaded: SluiceConfig): Promise<Gateway> {
  const replicaId = loaded.replica.id ?? `gw-${randomUUID().slice(0, 8)}`;
  const { limits } = loaded;
  const app = Fastify({
    logger: loggerOptions(loaded.logLevel, 'gateway'),
    // Per-request logs would cost more than the request itself on the hot path.
    logController: new LogController({ disableRequestLogging: true }),
    bodyLimit: limits.maxBodyBytes,
  });
  const log = app.log;
  const config = await discoverModels(loaded, 30_000, log);
  const router = createRouter(config);
  const keys = keySpace(config.redis.prefix);
  const registry = new Registry();
  collectDefaultMetrics({ register: registry, prefix: 'sluice_gateway_' });
  const metrics = gatewayMetrics(registry);
  const now = Date.now;

  const redis = createRedis(config.redis.url, {
    name: `sluice:gateway:${replicaId}:command`,
    role: 'command',
  });
  const bull = createRedis(config.redis.url, {
    name: `sluice:gateway:${replicaId}:bullmq`,
    role: 'bullmq',
  });
  const subscriber = createRedis(config.redis.url, {
    name: `sluice:gateway:${replicaId}:replies`,
    role: 'subscriber',
  });
  for (const conn of [redis, bull, subscriber])
    conn.on('error', (err) => log.warn({ err: err.message }, 'redis connection error'));
  await Promise.all([redisReady(redis), redisReady(bull), redisReady(subscriber)]);

  const pools = new Map(
    config.pools.map((pool) => [
      pool.name,
      new PoolQueue(pool, keys, redis, bull, limits.maxPriority, now),
    ]),
  );
  const replies = new ReplyRouter(
    subscriber,
    keys.replyChannel(replicaId),
    config.relay.silenceTimeoutMs,
    now,
    (kind) => metrics.badFrames.inc({ kind }),
  );
  await replies.start();
  const heartbeat = new ReplicaHeartbeat(
    redis,
    keys.replicaAlive(replicaId),
    config.replica.ttlMs,
    (err) => log.warn({ err }, 'replica heartbeat failed'),
  );
  await heartbeat.start();
  const passthrough = new Passthrough();

  const publishCancel = cancelPublisher(redis, keys.cancelChannel, {
    onGiveUp: (jobId, err) => log.warn({ err, jobId }, 'cancel publish failed'),
  });
  const held = new HeldClients({
    replies,
    redis,
    subscriber,
    redisLossGraceMs: limits.redisLossGraceSeconds * 1000,
    drainMs: limits.shutdownDrainSeconds * 1000,
    log,
  });

  function refuse(reply: FastifyReply, model: string, r: Refusal) {
    metrics.rejected.inc({ model, reason: r.reason });
    return reply.code(r.status).headers(refusalHeaders(r)).send(refusalBody(r));
  }

  acceptRawJson(app);
  installErrorHandler(app, { maxBodyBytes: limits.maxBodyBytes, refuse });
  const hooksDeps: HeldHooksDeps = {
    heartbeatSeconds: limits.heartbeatSeconds,
    slowClientBytes: limits.slowClientBytes,
    slowClientStallSeconds: limits.slowClientStallSeconds,
    now,
    metrics,
    replies,
    publishCancel,
  };
  await app.register(completionRoutes, {
    replicaId,
    limits,
    router,
    pools,
    redis,
    replies,
    passthrough,
    metrics,
    now,
    heldHooks: (pool, model) => heldHooks(hooksDeps, pool, model),
    admit: (kind) => held.admit(kind),
    refuse,
  });
  await app.register(opsRoutes, {
    replicaId,
    config,
    redis,
    pools,
    registry,
    draining: () => held.draining,
  });

  const url = await app.listen({ host: config.http.host, port: config.http.port });
  log.info(
    { replica: replicaId, url, models: config.pools.flatMap((p) => p.models) },
    'gateway ready',
  );

  return {
    replicaId,
    url,
    async close() {
      await held.shutdown();
      held.stop();
      replies.stop();
      await heartbeat.stop();
      // Every held client is answered; what is left are idle keep-alive connections and
      // pass-through requests, which get a second.
      const force = setTimeout(() => app.server.closeAllConnections(), 1000);
      await app.close();
      clearTimeout(force);
      await passthrough.close();
      await Promise.all([...pools.values()].map((p) => p.close()));
      await Promise.all(
        [redis.quit(), bull.quit(), subscriber.quit()].map((p) => p.catch(() => {})),
      );
    },
    cutDrainShort: () => held.cutDrainShort(),
  };
}

export async function runGateway(): Promise<void> {
  let config: SluiceConfig;
  try {
    config = loadConfig(process.env);
  } catch (err) {
    if (err instanceof ConfigError) {
      process.stderr.write(`sluice gateway: ${err.message}\n`);
      process.exitCode = 2;
      return;
    }
    throw err;
  }
  const gateway = await startGateway(config);
  let closing = false;
  const stop = () => {
    if (closing) return gateway.cutDrainShort();
    closing = true;
    void gateway.close().then(() => process.exit(0));
  };
  process.on('SIGINT', stop);
  process.on('SIGTERM', stop);
}
