// `sluice gateway`: one stateless replica of the HTTP edge.
import { randomUUID } from 'node:crypto';
import { ConfigError, createRouter, loadConfig, type SluiceConfig } from '@sluice/config';
import {
  collectDefaultMetrics,
  gatewayMetrics,
  loggerOptions,
  markStage,
  Registry,
} from '@sluice/observability';
import { estimatePromptTokens, peekRequest, RequestPeekError } from '@sluice/openai';
import { classify, isAged, retryAfterBounds } from '@sluice/admission';
import {
  encodeCancel,
  keySpace,
  sluiceHeaders,
  type CompletionPath,
  type JobPayload,
} from '@sluice/protocol';
import { createRedis, redisHealthy, redisReady } from '@sluice/redis';
import Fastify, { LogController, type FastifyReply, type FastifyRequest } from 'fastify';
import { discoverModels } from './discovery.js';
import { HeldRequest, type HeldRequestHooks } from './held-request.js';
import { Passthrough } from './passthrough.js';
import { PoolQueue } from './pool-queue.js';
import { refusal, refusalBody, refusalHeaders, type Refusal } from './refuse.js';
import { ReplicaHeartbeat } from './replica.js';
import { ReplyRouter } from './replies.js';

export interface Gateway {
  readonly replicaId: string;
  readonly url: string;
  close(): Promise<void>;
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

  const publishCancel = (jobId: string, reason: string) => {
    redis
      .publish(keys.cancelChannel, encodeCancel(jobId, reason))
      .catch((err: unknown) => log.warn({ err, jobId }, 'cancel publish failed'));
  };

  function refuse(reply: FastifyReply, model: string, r: Refusal) {
    metrics.rejected.inc({ model, reason: r.reason });
    return reply.code(r.status).headers(refusalHeaders(r)).send(refusalBody(r));
  }

  // Bodies arrive as raw bytes: the single-pass peek reads what Sluice needs, and the
  // engine receives exactly what the client sent.
  app.removeAllContentTypeParsers();
  app.addContentTypeParser('application/json', { parseAs: 'buffer' }, (_request, body, done) =>
    done(null, body),
  );
  app.setErrorHandler((error: Error & { code?: string; statusCode?: number }, request, reply) => {
    const model = '';
    if (error.code === 'FST_ERR_CTP_BODY_TOO_LARGE')
      return refuse(
        reply,
        model,
        refusal(
          'body_too_large',
          `request body exceeds MAX_BODY_BYTES (${limits.maxBodyBytes} bytes)`,
        ),
      );
    if (error.code === 'FST_ERR_CTP_INVALID_MEDIA_TYPE')
      return refuse(
        reply,
        model,
        refusal(
          'unsupported_media_type',
          `content-type must be application/json, got ${JSON.stringify(request.headers['content-type'] ?? '')}`,
        ),
      );
    if (error.code === 'FST_ERR_CTP_EMPTY_JSON_BODY')
      return refuse(reply, model, refusal('bad_request', 'request body is empty'));
    if (error.statusCode && error.statusCode >= 400 && error.statusCode < 500)
      return refuse(reply, model, refusal('bad_request', error.message));
    log.error({ err: error }, 'unhandled error');
    return refuse(reply, model, refusal('internal_error', 'internal error'));
  });

  const heldHooks = (pool: PoolQueue, model: string): HeldRequestHooks => ({
    heartbeatMs: limits.heartbeatSeconds * 1000,
    maxParkMs: pool.pool.maxParkSeconds * 1000,
    slowClientBytes: limits.slowClientBytes,
    now,
    removeQueued: (jobId) => pool.removeQueued(jobId),
    cancel: publishCancel,
    retryAfter: () => pool.retryAfter(),
    onHeartbeat: () => metrics.heartbeats.inc(),
    onStarted: (_held, wait) => {
      metrics.parked.dec({ model });
      metrics.queueWait.observe({ model }, wait);
    },
    onFirstByte: (held) => metrics.ttft.observe({ model }, (now() - held.receivedAt) / 1000),
    onRefused: (_held, r) => metrics.rejected.inc({ model, reason: r.reason }),
    onDone: (held, wasQueued) => {
      if (wasQueued) metrics.parked.dec({ model });
      metrics.holding.dec();
      replies.held.delete(held.jobId);
    },
  });

  function completion(path: CompletionPath) {
    return async (request: FastifyRequest, reply: FastifyReply) => {
      const receivedAt = now();
      markStage('gateway.request');
      const body = request.body as Buffer | undefined;
      if (!body)
        return refuse(
          reply,
          '',
          refusal('unsupported_media_type', 'content-type must be application/json'),
        );
      let peeked;
      try {
        peeked = peekRequest(body);
      } catch (err) {
        if (err instanceof RequestPeekError)
          return refuse(reply, '', refusal('bad_request', err.message));
        throw err;
      }
      const model = peeked.model;
      const route = router.route(model);
      if (!route)
        return refuse(
          reply,
          model,
          refusal('model_not_found', `The model \`${model}\` does not exist.`),
        );
      if (route.kind === 'passthrough') {
        metrics.requests.inc({ model, kind: 'passthrough' });
        reply.hijack();
        return passthrough.forward(route.url, path, request.headers, body, reply.raw);
      }
      metrics.requests.inc({ model, kind: 'gated' });
      const pool = pools.get(route.pool.name)!;
      if (redis.status !== 'ready')
        return refuse(
          reply,
          model,
          refusal('redis_unavailable', 'queue unavailable (Redis unreachable)'),
        );
      if (!(await pool.hasLeader()))
        return refuse(
          reply,
          model,
          refusal(
            'no_leader',
            `no dispatcher is leading pool ${route.pool.name}`,
            await pool.retryAfter(),
          ),
        );

      const jobId = randomUUID();
      const stream = peeked.stream === true;
      const payload: JobPayload = {
        v: 1,
        body: body.toString('utf8'),
        path,
        stream,
        replica: replicaId,
        enqueuedAt: now(),
        deadline: now() + route.pool.maxParkSeconds * 1000,
        priority: priorityOf(request.headers[limits.priorityHeader], limits.maxPriority),
      };
      const maxTokens = peeked.maxCompletionTokens ?? peeked.maxTokens;
      if (maxTokens !== undefined) payload.maxTokens = maxTokens;
      const promptTokens = estimatePromptTokens(body, peeked);
      payload.promptTokens = promptTokens;
      const longPrompts = route.pool.longPrompts;
      const promptClass = classify(promptTokens, longPrompts);
      metrics.promptTokens.observe({ model, class: promptClass }, promptTokens);
      if (promptClass === 'long') {
        // Honest waiting: when the long prompts ahead would keep this one past its park limit,
        // say so now instead of holding the client for the whole limit first.
        const wait = await pool.longWait().catch(() => undefined);
        if (wait !== undefined && wait > route.pool.maxParkSeconds)
          return refuse(
            reply,
            model,
            refusal(
              'long_backlog',
              `pool ${route.pool.name}: the long prompts ahead need about ${Math.ceil(wait)} s of prefill, more than the ${route.pool.maxParkSeconds} s park limit`,
              // Once that much of the backlog has drained, waiting fits the park limit.
              Math.max(
                retryAfterBounds.min,
                Math.min(retryAfterBounds.max, Math.ceil(wait - route.pool.maxParkSeconds)),
              ),
            ),
          );
      }
      if (route.pool.degradation.allowOptOut && request.headers[sluiceHeaders.degrade] === 'off')
        payload.optOut = true;

      reply.hijack();
      const held = new HeldRequest(
        jobId,
        model,
        stream,
        receivedAt,
        payload.enqueuedAt,
        reply.raw,
        heldHooks(pool, model),
      );
      // Registered before the add: frames may arrive before BullMQ's add resolves.
      replies.held.set(jobId, held);
      metrics.holding.inc();
      metrics.parked.inc({ model });
      held.hold();
      try {
        markStage('gateway.enqueue');
        // A long prompt is queued at the aged level at once when its aging limit is zero.
        const level =
          promptClass === 'short'
            ? 'short'
            : isAged(payload.enqueuedAt, longPrompts, payload.enqueuedAt)
              ? 'aged'
              : 'long';
        const admitted = await pool.add(jobId, payload, level);
        markStage('gateway.enqueued');
        if (!admitted)
          held.fail(
            refusal(
              'queue_full',
              `pool ${route.pool.name} has ${route.pool.queueDepth} requests queued (VLLM_MAX_QUEUE_DEPTH)`,
              await pool.retryAfter(),
            ),
          );
      } catch (err) {
        log.warn({ err }, 'enqueue failed');
        held.fail(refusal('redis_unavailable', 'queue unavailable (Redis error)'));
      }
    };
  }

  app.post('/v1/chat/completions', completion('/v1/chat/completions'));
  app.post('/v1/completions', completion('/v1/completions'));
  app.get('/v1/models', async () => ({
    object: 'list',
    data: [...config.pools.flatMap((p) => p.models), ...config.passthrough.map((p) => p.model)].map(
      (id) => ({ id, object: 'model', created: 0, owned_by: 'sluice' }),
    ),
  }));
  app.get('/healthz', async () => ({ status: 'ok', replica: replicaId }));
  app.get('/readyz', async (_request, reply) => {
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

  const url = await app.listen({ host: config.http.host, port: config.http.port });
  log.info(
    { replica: replicaId, url, models: config.pools.flatMap((p) => p.models) },
    'gateway ready',
  );

  return {
    replicaId,
    url,
    async close() {
      replies.stop();
      await heartbeat.stop();
      // Held streams can last minutes: give them a moment, then cut.
      const force = setTimeout(() => app.server.closeAllConnections(), 5000);
      await app.close();
      clearTimeout(force);
      await passthrough.close();
      await Promise.all([...pools.values()].map((p) => p.close()));
      await Promise.all(
        [redis.quit(), bull.quit(), subscriber.quit()].map((p) => p.catch(() => {})),
      );
    },
  };
}

/** Priority from the configured header, clamped to 0..max; absent or unreadable = 0. */
function priorityOf(header: string | string[] | undefined, max: number): number {
  const value = Number(Array.isArray(header) ? header[0] : header);
  if (!Number.isFinite(value)) return 0;
  return Math.min(max, Math.max(0, Math.trunc(value)));
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
  const stop = () => void gateway.close().then(() => process.exit(0));
  process.once('SIGINT', stop);
  process.once('SIGTERM', stop);
}
