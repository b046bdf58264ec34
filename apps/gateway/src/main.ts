// `sluice gateway`: one stateless replica of the HTTP edge.
//
// Start-up never waits: the replica listens at once, connects to Redis and learns its
// engines' model names in the background, and answers 503 until each is there (/readyz
// says which). Only a wrong Redis password is fatal: waiting cannot fix it.
import { ConfigError, loadConfig, type SluiceConfig } from '@sluice/config';
import {
  collectDefaultMetrics,
  gatewayMetrics,
  loggerOptions,
  primeRejected,
  Registry,
} from '@sluice/observability';
import { keySpace, refusalKinds } from '@sluice/protocol';
import {
  createRedis,
  describeTopology,
  isCluster,
  redisReady,
  RedisTlsError,
  type Redis,
} from '@sluice/redis';
import Fastify, { LogController, type FastifyReply } from 'fastify';
import { isCompletionRequest, refusedEnd, requestEnded } from './access-log.js';
import { installAuth } from './auth.js';
import { AuthThrottle } from './auth-throttle.js';
import { cacheSaltsFor } from './cache-salt.js';
import { cancelPublisher } from './cancels.js';
import { installCors } from './cors.js';
import { discoverModels, ModelFollower } from './discovery.js';
import { MODEL_CARDS_REFRESH_MS, ModelCards } from './model-cards.js';
import { clientErrorHandler, frameworkErrorHandler, installErrorHandlers } from './errors.js';
import { DrainingConnections } from './drain.js';
import { HeldClients } from './held-clients.js';
import { heldHooks, type HeldHooksDeps } from './held-hooks.js';
import { UNKNOWN_MODEL } from './labels.js';
import { startMetricsServer, type MetricsServer } from './metrics-server.js';
import { Passthrough } from './passthrough.js';
import { PoolQueue, readLeaders } from './pool-queue.js';
import { RedisProbe } from './redis-probe.js';
import { refusalBody, refusalHeaders, type Refusal } from './refuse.js';
import { ReplicaHeartbeat } from './replica.js';
import { deafAfterMs, ReplyHeartbeat } from './reply-heartbeat.js';
import { processReplicaId } from './replica-id.js';
import { ReplyRouter } from './replies.js';
import { installRequestId, REQUEST_ID_HEADER, requestId } from './request-id.js';
import { Routing } from './routing.js';
import { acceptRawJson, completionRoutes } from './routes/completions.js';
import { opsRoutes } from './routes/ops.js';
import { withTimeout } from './timeout.js';

/**
 * How long closing BullMQ's queues and QUITting the connections may take. A stopped Redis
 * (SIGSTOP, a partition) keeps its sockets open and its connections `ready`, and neither
 * step has a bound of its own; past this the connections are dropped. Part of the 4 s margin
 * of the gateway's grace period (deploy/README.md, "Shutdown arithmetic").
 */
const REDIS_CLOSE_MS = 2000;

export interface Gateway {
  readonly replicaId: string;
  readonly url: string;
  /** Resolves (never rejects) with the error this replica cannot run past: a wrong Redis password. */
  readonly fatal: Promise<Error>;
  /** Drains (SHUTDOWN_DRAIN_SECONDS at most, less when nothing is held), then closes. */
  close(): Promise<void>;
  /** Ends a drain in progress now (a second signal). */
  cutDrainShort(): void;
}

export async function startGateway(loaded: SluiceConfig): Promise<Gateway> {
  const replicaId = processReplicaId(loaded.replica.id);
  const { limits } = loaded;
  const registry = new Registry();
  collectDefaultMetrics({ register: registry, prefix: 'sluice_gateway_' });
  const metrics = gatewayMetrics(registry, {
    // What requests get (readLeaders, as /readyz): unknown while Redis does not answer, no
    // series then.
    poolLeaders: () => readLeaders(pools, redisUp()),
    redisUp: () => redisUp(),
  });
  // Every routed model's refusal series from the start, at 0 (see primeRejected), again once
  // discovery has named the models of pools configured without them.
  const primeRefusals = (config: SluiceConfig) =>
    primeRejected(
      metrics,
      [...config.pools.flatMap((p) => p.models), ...config.passthrough.map((p) => p.model)],
      Object.keys(refusalKinds),
    );
  primeRefusals(loaded);
  const onClientRefused = (r: Refusal) =>
    metrics.rejected.inc({ model: UNKNOWN_MODEL, reason: r.reason });
  const requestTimeoutMs = Math.ceil(limits.requestTimeoutSeconds * 1000);
  const app = Fastify({
    logger: loggerOptions(loaded.logLevel, 'gateway'),
    // Fastify's request logging (two lines per request, probes included) stays off: the
    // access log (access-log.ts) writes one line per completion request instead.
    logController: new LogController({ disableRequestLogging: true }),
    genReqId: (req) => requestId(req.headers[REQUEST_ID_HEADER]),
    // `request.ip`, which the wrong-key throttle counts by: the connection's peer, or with
    // GATEWAY_TRUST_PROXY the client those proxies name in X-Forwarded-For.
    ...(loaded.http.trustProxy === undefined ? {} : { trustProxy: loaded.http.trustProxy }),
    bodyLimit: limits.maxBodyBytes,
    // Receiving a request is timed (headers and body); answering it is not: held requests
    // wait minutes. connectionTimeout, the socket's idle timeout, stays off for that reason:
    // a non-streaming client waits silently for up to its park limit.
    requestTimeout: requestTimeoutMs,
    http: {
      headersTimeout: Math.min(60_000, requestTimeoutMs),
      // Node checks the two timeouts on this period (30 s by default, longer than the timeout).
      connectionsCheckingInterval: Math.max(100, Math.min(1000, Math.floor(requestTimeoutMs / 2))),
    },
    frameworkErrors: frameworkErrorHandler((reply, r) => refuse(reply, UNKNOWN_MODEL, r)),
    clientErrorHandler: clientErrorHandler({
      onRefused: onClientRefused,
      requestTimeoutSeconds: limits.requestTimeoutSeconds,
    }),
  });
  const log = app.log;
  const routing = new Routing(loaded);
  const keys = keySpace(loaded.redis.prefix);
  const now = Date.now;
  const ended = requestEnded(log, metrics, loaded.accessLog);

  const connect = (role: 'command' | 'bullmq' | 'subscriber', suffix: string) => {
    const conn = createRedis(loaded.redis, {
      name: `sluice:gateway:${replicaId}:${suffix}`,
      role,
    });
    conn.on('error', (err) => log.warn({ err: err.message }, 'redis connection error'));
    return conn;
  };
  const redis = connect('command', 'command');
  const bull = connect('bullmq', 'bullmq');
  const subscriber = connect('subscriber', 'replies');
  let connected = false;
  const probe = new RedisProbe(redis, (up) =>
    up ? log.info('redis answering') : log.warn('redis not answering'),
  );
  // The subscriber delivers too: a deaf one (reply-heartbeat.ts) refuses requests and /readyz
  // as Redis unreachable does, for the same reason: no answer would reach this replica.
  const hearing = new ReplyHeartbeat({
    publisher: redis,
    subscriber,
    channel: keys.replyHeartbeatChannel(replicaId),
    deafMs: deafAfterMs(limits.redisLossGraceSeconds * 1000, loaded.relay.silenceTimeoutMs),
    answering: () => probe.up,
    onDeaf: (silentMs) => {
      metrics.replyChannelDeaf.inc();
      log.warn(
        { silentMs: Math.round(silentMs) },
        'reply channel deaf (redis answers, no heartbeat comes back): subscriber reconnected',
      );
    },
    onHeard: () => log.info('reply channel heard again'),
  });
  const redisUp = () => connected && probe.up && !hearing.deaf;

  const pools = new Map(
    loaded.pools.map((pool) => [
      pool.name,
      new PoolQueue(pool, keys, redis, bull, limits.maxPriority, now),
    ]),
  );
  for (const pool of pools.values())
    pool.queue.on('error', (err) => log.warn({ err: err.message }, 'queue error'));
  const publishCancel = cancelPublisher(redis, keys.cancelChannel, {
    countsReceivers: !isCluster(redis),
    onGiveUp: (jobId, err) => log.warn({ err, jobId }, 'cancel publish failed'),
  });
  const replies = new ReplyRouter(
    subscriber,
    keys.replyChannel(replicaId),
    loaded.relay.silenceTimeoutMs,
    now,
    (kind) => metrics.badFrames.inc({ kind }),
    (jobId, reason) => {
      log.warn({ jobId }, 'reply frames for a job this replica does not hold: job cancelled');
      publishCancel(jobId, reason);
    },
    hearing,
  );
  const heartbeat = new ReplicaHeartbeat(
    redis,
    keys.replicaAlive(replicaId),
    loaded.replica.ttlMs,
    (err) => log.warn({ err }, 'replica heartbeat failed'),
  );
  // Tenants see no engine's name or address unless the operator lets them (refuse.ts).
  const engineDetails = loaded.tenants === undefined || loaded.tenantEngineDetails;
  const passthrough = new Passthrough(
    loaded.tenants !== undefined,
    { ...loaded.engine, slowClientStallMs: limits.slowClientStallSeconds * 1000 },
    engineDetails,
  );

  const held = new HeldClients({
    replies,
    passthrough,
    pools,
    redis,
    subscriber,
    answers: probe,
    hearing,
    redisLossGraceMs: limits.redisLossGraceSeconds * 1000,
    drainMs: limits.shutdownDrainSeconds * 1000,
    log,
  });
  const connections = new DrainingConnections(app.server);

  function refuse(reply: FastifyReply, model: string, r: Refusal, pool?: string, stream?: boolean) {
    metrics.rejected.inc({ model, reason: r.reason });
    const request = reply.request;
    const tenant = request.tenant;
    if (tenant) metrics.tenantRejected.inc({ tenant: tenant.name, reason: r.reason });
    if (isCompletionRequest(request)) ended(refusedEnd(request, model, r, now(), pool, stream));
    return reply.code(r.status).headers(refusalHeaders(r)).send(refusalBody(r));
  }

  acceptRawJson(app);
  installRequestId(app, now);
  // Before the key check: a browser's preflight carries no key (GATEWAY_CORS_*).
  installCors(app, loaded.cors);
  // With tenants, the API port's /metrics (every tenant's series) needs a key, unless
  // GATEWAY_METRICS_PORT serves it elsewhere (then the API port answers it 404).
  const metricsElsewhere = loaded.http.gatewayMetricsPort !== undefined;
  const { authFailures } = loaded;
  installAuth(app, loaded.tenants, (reply, r) => refuse(reply, UNKNOWN_MODEL, r), {
    metricsElsewhere,
    ...(authFailures.limit > 0 && {
      throttle: new AuthThrottle(
        {
          limit: authFailures.limit,
          windowMs: authFailures.windowSeconds * 1000,
          maxAddresses: authFailures.maxAddresses,
        },
        // Monotonic: a clock set back must not lengthen a window.
        () => performance.now(),
      ),
    }),
  });
  if (loaded.tenants !== undefined && !metricsElsewhere)
    log.warn(
      'tenants are configured and /metrics is on the API port: it needs a tenant key there, and any tenant key shows every tenant; set GATEWAY_METRICS_PORT to scrape a port of its own without one',
    );
  installErrorHandlers(app, {
    maxBodyBytes: limits.maxBodyBytes,
    requestTimeoutSeconds: limits.requestTimeoutSeconds,
    refuse,
    onRefused: onClientRefused,
  });
  const hooksDeps: HeldHooksDeps = {
    heartbeatSeconds: limits.heartbeatSeconds,
    slowClientBytes: limits.slowClientBytes,
    slowClientStallSeconds: limits.slowClientStallSeconds,
    engineDetails,
    now,
    metrics,
    replies,
    publishCancel,
    ended,
  };
  await app.register(completionRoutes, {
    replicaId,
    limits,
    routing,
    pools,
    redisUp,
    replies,
    passthrough,
    metrics,
    now,
    heldHooks: (pool, info) => heldHooks(hooksDeps, pool, info),
    admit: (kind) => held.admit(kind),
    refuse,
    ended,
    // Once per tenant, here at start-up: each tenant's vLLM cache_salt (cache-salt.ts).
    cacheSalts: cacheSaltsFor(loaded),
  });
  const cards = new ModelCards();
  await app.register(opsRoutes, {
    replicaId,
    routing,
    cards,
    redisUp,
    hearing: () => !hearing.deaf,
    pools,
    registry,
    draining: () => held.draining,
    serveMetrics: loaded.http.gatewayMetricsPort === undefined,
  });

  let url: string | undefined;
  let closing = false;
  let fail!: (err: Error) => void;
  const fatal = new Promise<Error>((resolve) => (fail = resolve));
  let announced = false;
  const announce = () => {
    if (announced || url === undefined || !connected || !routing.known) return;
    announced = true;
    const models = routing.config.pools.flatMap((p) => p.models);
    log.info({ replica: replicaId, url, models }, 'gateway ready');
  };

  // Waits as long as Redis takes to appear; rejects only for a wrong password (RedisAuthError)
  // or a Redis that refuses the subscription. Watched from the start: the connections are
  // already connecting, and an early refusal must not be missed.
  void (async () => {
    await Promise.all([redisReady(redis), redisReady(bull), redisReady(subscriber)]);
    await replies.start();
    await hearing.start();
    await heartbeat.start();
    probe.start();
    connected = true;
    announce();
  })().catch((err: Error) => {
    if (!closing) fail(err);
  });

  // Aborts discovery and the model cards' reads on close.
  const discovery = new AbortController();
  // Each read of the cards also routes what the engines list now: LoRA adapters loaded at
  // runtime, models a discovered pool gained or lost (ModelFollower, discovery.ts).
  // Their refusal series are not primed: adapters come and go, and primed series stay
  // (about 30 per name); the models known at start and at discovery are.
  const follower = new ModelFollower(loaded, log);
  const readCards = () => void follower.read(cards, routing, discovery.signal);
  const cardsTimer = setInterval(readCards, MODEL_CARDS_REFRESH_MS).unref();
  discovery.signal.addEventListener('abort', () => clearInterval(cardsTimer));
  if (routing.known) readCards();
  else
    void discoverModels(loaded, log, discovery.signal).then(
      (config) => {
        routing.update(config);
        primeRefusals(config);
        announce();
        readCards();
      },
      (err: Error) => {
        if (!discovery.signal.aborted) fail(err);
      },
    );

  let metricsServer: MetricsServer | undefined;
  try {
    url = await app.listen({ host: loaded.http.host, port: loaded.http.port });
    const { gatewayMetricsPort } = loaded.http;
    if (gatewayMetricsPort !== undefined)
      metricsServer = await startMetricsServer(registry, loaded.http.host, gatewayMetricsPort);
  } catch (err) {
    // Nothing else may keep the process alive once start-up has failed.
    closing = true;
    discovery.abort();
    replies.stop();
    hearing.stop();
    await app.close();
    for (const conn of [redis, bull, subscriber]) conn.disconnect();
    throw err;
  }
  log.info(
    {
      replica: replicaId,
      url,
      ...(metricsServer ? { metricsUrl: metricsServer.url } : {}),
      redis: describeTopology(loaded.redis),
      tenants: loaded.tenants?.map((t) => t.name) ?? null,
    },
    'gateway listening',
  );
  announce();

  return {
    replicaId,
    url,
    fatal,
    async close() {
      closing = true;
      discovery.abort();
      const drained = held.shutdown();
      connections.start();
      await drained;
      held.stop();
      probe.stop();
      hearing.stop();
      replies.stop();
      // Every held and pass-through request is answered and idle connections are closed;
      // what is left are connections still sending a request, which get a second. The
      // liveness key goes meanwhile (bounded by the command timeout, 1 s, when Redis is away).
      const force = setTimeout(() => app.server.closeAllConnections(), 1000);
      await Promise.all([heartbeat.stop(), app.close()]);
      clearTimeout(force);
      await passthrough.close();
      await metricsServer?.close();
      const conns = [redis, bull, subscriber];
      await withTimeout(
        Promise.all([...pools.values()].map((p) => p.close())).then(() =>
          Promise.all(conns.map(closeRedis)),
        ),
        'closing the queues and Redis connections',
        REDIS_CLOSE_MS,
      ).catch((err: Error) => log.warn({ err: err.message }, 'redis connections dropped'));
      for (const conn of conns) conn.disconnect();
    },
    cutDrainShort: () => held.cutDrainShort(),
  };
}

/** QUIT when connected; a connection still trying to reach Redis is simply dropped. */
async function closeRedis(conn: Redis): Promise<void> {
  if (conn.status !== 'ready') return conn.disconnect();
  await conn.quit().catch(() => conn.disconnect());
}

export async function runGateway(): Promise<void> {
  let gateway: Gateway;
  try {
    gateway = await startGateway(loadConfig(process.env));
  } catch (err) {
    // A configuration refused, REDIS_TLS_CA_FILE unreadable included: one line, exit 2.
    if (err instanceof ConfigError || err instanceof RedisTlsError) {
      process.stderr.write(`sluice gateway: ${err.message}\n`);
      process.exitCode = 2;
      return;
    }
    throw err;
  }
  void gateway.fatal.then((err) => {
    process.stderr.write(`sluice gateway: ${err.message.replace(/\s+/g, ' ')}\n`);
    process.exit(1);
  });
  let closing = false;
  const stop = () => {
    if (closing) return gateway.cutDrainShort();
    closing = true;
    void gateway.close().then(() => process.exit(0));
  };
  process.on('SIGINT', stop);
  process.on('SIGTERM', stop);
}
