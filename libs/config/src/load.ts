// Environment (+ optional YAML file) → SluiceConfig. Pure apart from the injected readFile:
// no network, no discovery, no logging. Every value is validated; the first bad one throws.
import { readFileSync } from 'node:fs';
import { copyDegradation, defaultDegradation } from './degradation.js';
import { ConfigError, invalid, show } from './errors.js';
import { readPoolFile } from './file.js';
import { redisConfig } from './redis.js';
import { engineNameFromUrl } from './rules.js';
import type { LongPromptConfig, MaxInflightSource, PoolConfig, SluiceConfig } from './types.js';
import {
  VARIABLES,
  VLLM_DEFAULT_MAX_NUM_SEQS,
  readVariables,
  type EnvValues,
} from './variables.js';

export type ReadFile = (path: string) => string;

const readUtf8: ReadFile = (path) => readFileSync(path, 'utf8');

/** The relay's silence timeout must leave room for one lost liveness frame and then some. */
function checkRelay(vars: EnvValues): { livenessMs: number; silenceTimeoutMs: number } {
  const livenessMs = vars.must('SLUICE_RELAY_LIVENESS_MS');
  const silenceTimeoutMs = vars.must('SLUICE_RELAY_SILENCE_TIMEOUT_MS');
  if (silenceTimeoutMs > 2 * livenessMs) return { livenessMs, silenceTimeoutMs };
  // Blame the variable the operator wrote; when both are set, the timeout.
  if (!vars.isSet('SLUICE_RELAY_SILENCE_TIMEOUT_MS'))
    throw invalid(
      'SLUICE_RELAY_LIVENESS_MS',
      vars.shown('SLUICE_RELAY_LIVENESS_MS'),
      `less than half of SLUICE_RELAY_SILENCE_TIMEOUT_MS (${silenceTimeoutMs}), i.e. < ${silenceTimeoutMs / 2}`,
    );
  throw invalid(
    'SLUICE_RELAY_SILENCE_TIMEOUT_MS',
    vars.shown('SLUICE_RELAY_SILENCE_TIMEOUT_MS'),
    `more than 2 x SLUICE_RELAY_LIVENESS_MS (${livenessMs}), i.e. > ${2 * livenessMs}`,
  );
}

/** GATEWAY_METRICS_PORT must not be the API port it is meant to be separate from (0: both pick one). */
function httpConfig(vars: EnvValues): SluiceConfig['http'] {
  const port = vars.must('PORT');
  const gatewayMetricsPort = vars.get('GATEWAY_METRICS_PORT');
  const trustProxy = vars.get('GATEWAY_TRUST_PROXY');
  if (gatewayMetricsPort !== undefined && gatewayMetricsPort !== 0 && gatewayMetricsPort === port)
    throw invalid(
      'GATEWAY_METRICS_PORT',
      vars.shown('GATEWAY_METRICS_PORT'),
      `a port other than PORT (${port})`,
    );
  return {
    host: vars.must('HOST'),
    port,
    metricsPort: vars.must('METRICS_PORT'),
    ...(gatewayMetricsPort === undefined ? {} : { gatewayMetricsPort }),
    ...(trustProxy === undefined ? {} : { trustProxy }),
  };
}

function defaultCap(vars: EnvValues): {
  cap: number;
  source: Exclude<MaxInflightSource, 'config'>;
} {
  const explicit = vars.get('ADMISSION_MAX_INFLIGHT');
  if (explicit !== undefined) return { cap: explicit, source: 'ADMISSION_MAX_INFLIGHT' };
  const seqs = vars.get('VLLM_MAX_NUM_SEQS');
  if (seqs !== undefined) return { cap: seqs, source: 'VLLM_MAX_NUM_SEQS' };
  return { cap: VLLM_DEFAULT_MAX_NUM_SEQS, source: 'default' };
}

function readFileText(path: string, readFile: ReadFile): string {
  try {
    return readFile(path);
  } catch (error) {
    const detail = (error instanceof Error ? error.message : String(error)).split('\n')[0];
    throw invalid('SLUICE_CONFIG', show(path), `a readable file (${detail})`);
  }
}

/** Who this dispatcher is and which pools it may lead; SLUICE_POOLS names configured pools only. */
function dispatcherConfig(
  vars: EnvValues,
  pools: readonly PoolConfig[],
): SluiceConfig['dispatcher'] {
  const id = vars.get('SLUICE_DISPATCHER_ID');
  const allowed = vars.get('SLUICE_POOLS');
  const unknown = allowed?.find((name) => !pools.some((pool) => pool.name === name));
  if (unknown !== undefined)
    throw invalid(
      'SLUICE_POOLS',
      vars.shown('SLUICE_POOLS'),
      `names of configured pools (${pools.map((p) => p.name).join(', ') || 'none'}); ${show(unknown)} is not one`,
    );
  const maxLeasedPools = vars.get('SLUICE_MAX_LEASED_POOLS');
  return {
    ...(id === undefined ? {} : { id }),
    ...(allowed === undefined ? {} : { pools: allowed }),
    ...(maxLeasedPools === undefined ? {} : { maxLeasedPools }),
  };
}

/**
 * Reads and validates the whole configuration. Throws `ConfigError` (code `ERR_SLUICE_CONFIG`)
 * with a one-line message at the first bad value. Unknown `SLUICE_*` / `ADMISSION_*`
 * variables are ignored (the environment is shared); unknown keys in the YAML file are not.
 */
export function loadConfig(
  env: Readonly<Record<string, string | undefined>>,
  readFile: ReadFile = readUtf8,
): SluiceConfig {
  const vars = readVariables(env);
  const relay = checkRelay(vars);

  const gpuSource = vars.must('GPU_SOURCE');
  const dcgmUrl = vars.get('DCGM_URL');
  if (gpuSource === 'dcgm' && dcgmUrl === undefined)
    throw new ConfigError(
      'DCGM_URL',
      `DCGM_URL is unset: expected ${VARIABLES.DCGM_URL.allowed} when GPU_SOURCE=dcgm`,
    );

  const file = vars.get('SLUICE_CONFIG');
  const vllmUrl = vars.get('VLLM_URL');
  if (file !== undefined && vllmUrl !== undefined)
    throw invalid(
      'VLLM_URL',
      vars.shown('VLLM_URL'),
      `unset when SLUICE_CONFIG is set (${show(file)}); list the engine in that file instead`,
    );

  const { cap, source: envSource } = defaultCap(vars);
  const queueDepth = vars.must('VLLM_MAX_QUEUE_DEPTH');
  const maxParkSeconds = vars.must('ADMISSION_MAX_PARK_SECONDS');
  const apiKey = vars.get('VLLM_API_KEY');
  const degradation = copyDegradation(defaultDegradation);
  const degradationOff = vars.must('SLUICE_DEGRADATION') === 'off';
  const longPrompts: LongPromptConfig = {
    thresholdTokens: vars.must('ADMISSION_LONG_PROMPT_TOKENS'),
    maxShare: vars.must('ADMISSION_LONG_MAX_SHARE'),
    maxInPrefill: vars.must('ADMISSION_LONG_MAX_PREFILLS'),
    agingSeconds: vars.must('ADMISSION_LONG_AGING_SECONDS'),
    kvFit: vars.must('ADMISSION_LONG_KV_FIT') === 'on',
  };

  let pools: PoolConfig[] = [];
  let passthrough: SluiceConfig['passthrough'] = [];
  let tenants: SluiceConfig['tenants'];
  if (file !== undefined) {
    const contents = readPoolFile(file, readFileText(file, readFile), {
      maxInflight: cap,
      maxInflightSource: envSource,
      queueDepth,
      maxParkSeconds,
      apiKey,
      degradation,
      gpuSource,
      longPrompts,
      maxPriority: vars.must('SLUICE_MAX_PRIORITY'),
    });
    // SLUICE_DEGRADATION=off switches degradation off everywhere, whatever the file says.
    pools = degradationOff
      ? contents.pools.map((pool) => ({
          ...pool,
          degradation: { ...pool.degradation, enabled: false },
        }))
      : contents.pools;
    passthrough = contents.passthrough;
    tenants = contents.tenants;
  } else if (vllmUrl !== undefined) {
    const model = vars.get('VLLM_MODEL');
    pools = [
      {
        name: 'default',
        models: model === undefined ? [] : [model],
        engines: [
          {
            name: engineNameFromUrl(vllmUrl),
            url: vllmUrl,
            maxInflight: cap,
            capSource: envSource,
            ...(apiKey === undefined ? {} : { apiKey }),
            lane: 'any',
          },
        ],
        queueDepth,
        maxParkSeconds,
        degradation: { ...degradation, enabled: !degradationOff },
        longPrompts,
      },
    ];
  }

  const replicaId = vars.get('SLUICE_REPLICA_ID');
  return {
    redis: redisConfig(vars),
    http: httpConfig(vars),
    cors: {
      allowedOrigins: vars.must('GATEWAY_CORS_ALLOWED_ORIGINS'),
      allowedMethods: vars.must('GATEWAY_CORS_ALLOWED_METHODS'),
      allowedHeaders: vars.must('GATEWAY_CORS_ALLOWED_HEADERS'),
      allowCredentials: vars.must('GATEWAY_CORS_ALLOW_CREDENTIALS') === 'on',
    },
    authFailures: {
      limit: vars.must('GATEWAY_AUTH_FAILURE_LIMIT'),
      windowSeconds: vars.must('GATEWAY_AUTH_FAILURE_WINDOW_SECONDS'),
      maxAddresses: vars.must('GATEWAY_AUTH_FAILURE_ADDRESSES'),
    },
    pools,
    passthrough,
    ...(tenants === undefined ? {} : { tenants }),
    tenantCacheSalt: vars.must('SLUICE_TENANT_CACHE_SALT') === 'on',
    tenantEngineDetails: vars.must('SLUICE_TENANT_ENGINE_DETAILS') === 'on',
    admission: {
      kvThreshold: vars.must('ADMISSION_KV_THRESHOLD'),
      failMode: vars.must('ADMISSION_FAIL_MODE'),
      frozenGaugesSeconds: vars.must('ADMISSION_FROZEN_GAUGES_SECONDS'),
    },
    limits: {
      maxBodyBytes: vars.must('MAX_BODY_BYTES'),
      bodyKeyMinBytes: vars.must('SLUICE_BODY_KEY_MIN_BYTES'),
      heartbeatSeconds: vars.must('SSE_HEARTBEAT_SECONDS'),
      slowClientBytes: vars.must('SLUICE_SLOW_CLIENT_BYTES'),
      requestTimeoutSeconds: vars.must('GATEWAY_REQUEST_TIMEOUT_SECONDS'),
      slowClientStallSeconds: vars.must('SLUICE_SLOW_CLIENT_STALL_SECONDS'),
      redisLossGraceSeconds: vars.must('SLUICE_REDIS_LOSS_GRACE_SECONDS'),
      shutdownDrainSeconds: vars.must('SLUICE_SHUTDOWN_DRAIN_SECONDS'),
      priorityHeader: vars.must('SLUICE_PRIORITY_HEADER'),
      maxPriority: vars.must('SLUICE_MAX_PRIORITY'),
    },
    relay,
    lease: { ttlMs: vars.must('SLUICE_LEASE_TTL_MS') },
    replica: {
      ...(replicaId === undefined ? {} : { id: replicaId }),
      ttlMs: vars.must('SLUICE_REPLICA_TTL_MS'),
    },
    dispatcher: dispatcherConfig(vars, pools),
    engine: {
      scrapeIntervalMs: vars.must('ENGINE_SCRAPE_INTERVAL_MS'),
      staleAfterFailures: vars.must('ENGINE_STALE_AFTER_FAILURES'),
      headersTimeoutMs: vars.must('ENGINE_HEADERS_TIMEOUT_MS'),
      bodyTimeoutMs: vars.must('ENGINE_BODY_TIMEOUT_MS'),
    },
    gpu: { source: gpuSource, ...(dcgmUrl === undefined ? {} : { dcgmUrl }) },
    logLevel: vars.must('LOG_LEVEL'),
    accessLog: vars.must('SLUICE_ACCESS_LOG') === 'on',
  };
}
