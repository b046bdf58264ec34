// `sluice dispatcher`: one process that leads or stands by for every pool it may lead
// (SLUICE_POOLS, default all), at most SLUICE_MAX_LEASED_POOLS of them at once.
import { randomUUID } from 'node:crypto';
import {
  ConfigError,
  loadConfig,
  VLLM_DEFAULT_MAX_NUM_SEQS,
  type SluiceConfig,
} from '@sluice/config';
import {
  collectDefaultMetrics,
  dispatcherMetrics,
  loggerOptions,
  Registry,
} from '@sluice/observability';
import { decodeCancel, keySpace, ProtocolError } from '@sluice/protocol';
import {
  createRedis,
  describeTopology,
  isCluster,
  RedisAuthError,
  redisHealthy,
  redisReady,
  RedisTlsError,
} from '@sluice/redis';
import Fastify, { LogController } from 'fastify';
import { CancelBook, earlyCancelMs } from './cancels.js';
import { gpuMaxAgeMs, gpuUtilization, startGpu } from './gpu.js';
import { exportLedPoolsOnly } from './leader-metrics.js';
import { allowedPools, poolsToContend } from './lease-choice.js';
import { PoolDispatcher } from './pool-dispatcher.js';
import { Reach } from './reach.js';
import { RelayHub } from './relay.js';
import { ReplicaLiveness } from './replicas.js';
import { registerStatusPage } from './status-page.js';
import { limitedWarn } from './warn-limit.js';

export interface Dispatcher {
  readonly id: string;
  readonly pools: PoolDispatcher[];
  /** Base URL of the metrics/health server. */
  readonly url: string;
  close(): Promise<void>;
}

export async function startDispatcher(config: SluiceConfig): Promise<Dispatcher> {
  // Refused before anything is opened, so the command exits 2 with nothing to close.
  if (config.pools.length === 0)
    throw new ConfigError(
      'VLLM_URL',
      'no pools configured: set VLLM_URL (one engine) or SLUICE_CONFIG (a pools file)',
    );
  const id = config.dispatcher.id ?? `dispatcher-${randomUUID().slice(0, 8)}`;
  const app = Fastify({
    logger: loggerOptions(config.logLevel, 'dispatcher'),
    logController: new LogController({ disableRequestLogging: true }),
  });
  const log = app.log;
  const uncapped = config.pools.flatMap((p) => p.engines).filter((e) => e.capSource === 'default');
  if (uncapped.length > 0)
    log.warn(
      { engines: uncapped.map((e) => e.name), maxInflight: VLLM_DEFAULT_MAX_NUM_SEQS },
      `no cap set for these engines: using ${VLLM_DEFAULT_MAX_NUM_SEQS}, replaced only where their metrics show max_num_seqs (upstream vLLM shows none). vLLM's default --max-num-seqs is ${VLLM_DEFAULT_MAX_NUM_SEQS}, or 1024 on GPUs of 70 GiB or more other than A100: set ADMISSION_MAX_INFLIGHT (or maxInflight in the pools file) to the engine's value`,
    );

  const keys = keySpace(config.redis.prefix);
  const registry = new Registry();
  collectDefaultMetrics({ register: registry, prefix: 'sluice_dispatcher_' });
  const metrics = dispatcherMetrics(registry);
  const now = Date.now;
  const warn = limitedWarn(log);

  const redis = createRedis(config.redis, {
    name: `sluice:dispatcher:${id}:command`,
    role: 'command',
  });
  const bull = createRedis(config.redis, {
    name: `sluice:dispatcher:${id}:bullmq`,
    role: 'bullmq',
  });
  const subscriber = createRedis(config.redis, {
    name: `sluice:dispatcher:${id}:cancel`,
    role: 'subscriber',
  });
  const connections = [redis, bull, subscriber];
  for (const conn of connections) conn.on('error', (err) => warn('redis connection error', err));
  // QUIT would wait in the offline queue for a Redis that is away: disconnect those instead.
  const quitAll = () =>
    Promise.all(
      connections.map((c) =>
        c.status === 'ready' ? c.quit().catch(() => {}) : Promise.resolve(c.disconnect()),
      ),
    );

  // Listen at once: /healthz answers while Redis is away, /readyz says why it is not ready.
  const pools: PoolDispatcher[] = [];
  exportLedPoolsOnly(metrics, (name) =>
    pools.some((p) => p.pool.name === name && p.lease.isLeader),
  );
  app.get('/metrics', async (_request, reply) =>
    reply.type(registry.contentType).send(await registry.metrics()),
  );
  app.get('/healthz', async () => ({ status: 'ok', id }));
  app.get('/readyz', async (_request, reply) => {
    const ok = pools.length > 0 && (await redisHealthy(redis));
    return reply
      .code(ok ? 200 : 503)
      .send({ redis: ok, leading: pools.filter((p) => p.lease.isLeader).map((p) => p.pool.name) });
  });
  registerStatusPage(app, {
    id,
    redis,
    keys,
    configured: config.pools.map((p) => p.name),
    roles: () => ({
      leading: pools.filter((p) => p.lease.isLeader).map((p) => p.pool.name),
      standby: pools.filter((p) => !p.lease.isLeader).map((p) => p.pool.name),
    }),
    now,
  });
  let url: string;
  try {
    url = await app.listen({ host: config.http.host, port: config.http.metricsPort });
  } catch (err) {
    // The connections are already trying to reach Redis: nothing may keep the process alive.
    for (const conn of connections) conn.disconnect();
    throw err;
  }
  log.info(
    { id, url, redis: describeTopology(config.redis) },
    'dispatcher listening: waiting for Redis',
  );

  // Waits as long as Redis takes to appear; a wrong password rejects (RedisAuthError).
  try {
    await Promise.all(connections.map((c) => redisReady(c)));
  } catch (err) {
    await app.close();
    await quitAll();
    throw err;
  }

  // Pools outside SLUICE_POOLS get nothing here: no lease contention, worker or metrics.
  const ours = allowedPools(config.pools, config.dispatcher.pools);
  const cancels = new CancelBook(earlyCancelMs(ours), now);
  const pruneCancels = setInterval(() => cancels.prune(), 10_000);
  pruneCancels.unref();
  const replicas = new ReplicaLiveness(redis, keys, 500, config.replica.ttlMs, now);
  const reach = new Reach({
    redis,
    replicasSettled: () => replicas.settled(),
    keys,
    cancels,
    ledgers: () => pools.map((p) => p.ledger),
    replicaTtlMs: config.replica.ttlMs,
    lossGraceMs: config.limits.redisLossGraceSeconds * 1000,
    log,
    now,
  });
  const hub = new RelayHub(
    redis,
    config.relay.livenessMs,
    now,
    (type, bytes) => {
      metrics.relayFrames.inc({ type });
      if (bytes > 0) metrics.relayBytes.inc(bytes);
    },
    // On a Redis Cluster PUBLISH counts only the subscribers of the node that took it, so a
    // frame "heard by none" proves nothing there; dead replicas are still found by their
    // liveness keys (Reach.checkReplicas).
    isCluster(redis) ? () => {} : (channel) => reach.unheard(channel),
  );

  subscriber.on('message', (channel: string, message: string) => {
    // `sluice pool` names a pool whose mode it changed (pool-control.ts).
    if (channel === keys.controlChannel)
      return pools.find((p) => p.pool.name === message)?.controlChanged();
    try {
      const { jobId, reason } = decodeCancel(message);
      cancels.cancel(jobId, reason);
    } catch (err) {
      if (err instanceof ProtocolError) log.warn({ err: err.message }, 'bad cancel message');
      else log.error({ err }, 'cancel message failed');
    }
  });
  // The subscriber resubscribes by itself after a reconnect; this first one may meet an outage.
  await subscriber
    .subscribe(keys.cancelChannel, keys.controlChannel)
    .catch((err: unknown) => warn('subscribing to cancels failed', err));

  const names = (filter: (p: PoolDispatcher) => boolean) =>
    new Set(pools.filter(filter).map((p) => p.pool.name));
  const mayAcquire = (name: string) =>
    poolsToContend({
      allowed: ours.map((p) => p.name),
      leading: names((p) => p.lease.isLeader),
      trying: names((p) => p.lease.isAcquiring),
      limit: config.dispatcher.maxLeasedPools,
    }).includes(name);
  const gpuMaxAge = gpuMaxAgeMs(config.gpu.source, config.engine.scrapeIntervalMs);
  pools.push(
    ...ours.map(
      (pool) =>
        new PoolDispatcher(pool, {
          id,
          keys,
          redis,
          bullConnection: bull,
          hub,
          cancels,
          replicas,
          metrics,
          leaseTtlMs: config.lease.ttlMs,
          mayAcquire: () => mayAcquire(pool.name),
          tenants: config.tenants,
          timeouts: {
            headersTimeoutMs: config.engine.headersTimeoutMs,
            bodyTimeoutMs: config.engine.bodyTimeoutMs,
          },
          policy: {
            kvThreshold: config.admission.kvThreshold,
            failMode: config.admission.failMode,
            // Gauges older than the observer's stale window count as stale even before it flips.
            maxGaugeAgeMs: config.engine.scrapeIntervalMs * (config.engine.staleAfterFailures + 1),
            // Unchanged this long (step counter included), gauges that close the gate count as
            // frozen, and one probe request goes (libs/admission gate.ts, docs/broker.md).
            frozenAfterMs: config.admission.frozenGaugesSeconds * 1000,
          },
          scrape: {
            intervalMs: config.engine.scrapeIntervalMs,
            staleAfterFailures: config.engine.staleAfterFailures,
          },
          gpuUtilization: () => gpuUtilization(gpu, gpuMaxAge),
          log,
          now,
        }),
    ),
  );

  const gpu = await startGpu(
    config.gpu,
    metrics,
    gpuMaxAge,
    () => pools.forEach((p) => p.poke()),
    log,
  );
  await Promise.all(pools.map((p) => p.start()));
  reach.start();
  log.info(
    {
      id,
      url,
      maxLeasedPools: config.dispatcher.maxLeasedPools ?? 'no limit',
      pools: ours.map((p) => ({
        name: p.name,
        engines: p.engines.map((e) => `${e.name}=${e.url} cap ${e.maxInflight}`),
      })),
    },
    'dispatcher ready',
  );

  return {
    id,
    pools,
    url,
    async close() {
      clearInterval(pruneCancels);
      // Pools hand their leases over first and finish their jobs; only then is nobody
      // left whose client a check could find unreachable.
      await Promise.all(pools.map((p) => p.close()));
      reach.stop();
      await gpu?.stop();
      hub.stop();
      await app.close();
      await quitAll();
    },
  };
}

export async function runDispatcher(): Promise<void> {
  let config: SluiceConfig;
  try {
    config = loadConfig(process.env);
  } catch (err) {
    // A configuration it cannot run (no pools): refused like one loadConfig refuses.
    if (err instanceof ConfigError) {
      process.stderr.write(`sluice dispatcher: ${err.message}\n`);
      process.exit(2);
    }
    throw err;
  }
  let dispatcher: Dispatcher;
  try {
    dispatcher = await startDispatcher(config);
  } catch (err) {
    if (err instanceof RedisAuthError) {
      process.stderr.write(`sluice dispatcher: ${err.message}\n`);
      process.exit(1);
    }
    // A configuration it cannot run (no pools, REDIS_TLS_CA_FILE unreadable): refused like
    // one loadConfig refuses.
    if (err instanceof ConfigError || err instanceof RedisTlsError) {
      process.stderr.write(`sluice dispatcher: ${err.message}\n`);
      process.exit(2);
    }
    throw err;
  }
  // SIGTERM (a rolling update): hand the lease over, finish the jobs in flight, exit. A second
  // signal does not wait for them.
  let stopping = false;
  const stop = () => {
    if (stopping) process.exit(1);
    stopping = true;
    dispatcher.close().then(
      () => process.exit(0),
      (err: unknown) => {
        process.stderr.write(`sluice dispatcher: shutdown failed: ${String(err)}\n`);
        process.exit(1);
      },
    );
  };
  process.on('SIGINT', stop);
  process.on('SIGTERM', stop);
}
