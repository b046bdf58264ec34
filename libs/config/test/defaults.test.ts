import { describe, expect, it } from 'vitest';
import { loadConfig, type SluiceConfig } from '../src/index.js';

const DEFAULTS: SluiceConfig = {
  redis: { kind: 'single', url: 'redis://127.0.0.1:6379', prefix: 'sluice' },
  http: { host: '0.0.0.0', port: 8080, metricsPort: 9464 },
  // vLLM's defaults: --allowed-origins, --allowed-methods, --allowed-headers ["*"], no credentials.
  cors: { allowedOrigins: '*', allowedMethods: '*', allowedHeaders: '*', allowCredentials: false },
  authFailures: { limit: 20, windowSeconds: 60, maxAddresses: 100_000 },
  pools: [],
  passthrough: [],
  tenantCacheSalt: true,
  tenantEngineDetails: false,
  admission: { kvThreshold: 0.9, failMode: 'open', frozenGaugesSeconds: 10 },
  limits: {
    maxBodyBytes: 8 * 1_048_576,
    bodyKeyMinBytes: 65_536,
    heartbeatSeconds: 15,
    slowClientBytes: 4_194_304,
    requestTimeoutSeconds: 30,
    slowClientStallSeconds: 30,
    redisLossGraceSeconds: 4,
    shutdownDrainSeconds: 25,
    priorityHeader: 'x-sluice-priority',
    maxPriority: 10,
  },
  relay: { livenessMs: 1000, silenceTimeoutMs: 5000 },
  lease: { ttlMs: 5000 },
  replica: { ttlMs: 5000 },
  dispatcher: {},
  engine: {
    scrapeIntervalMs: 500,
    staleAfterFailures: 3,
    headersTimeoutMs: 900_000,
    bodyTimeoutMs: 300_000,
  },
  gpu: { source: 'none' },
  logLevel: 'info',
  accessLog: true,
};

describe('loadConfig: defaults', () => {
  it('gives every documented default for an empty environment', () => {
    expect(loadConfig({})).toStrictEqual(DEFAULTS);
  });

  it('treats an empty value as unset, as `FOO=` in a compose file means', () => {
    expect(loadConfig({ PORT: '', REDIS_URL: '', VLLM_URL: '', SLUICE_CONFIG: '' })).toStrictEqual(
      DEFAULTS,
    );
  });

  it('ignores unknown SLUICE_* and ADMISSION_* variables: the environment is shared', () => {
    expect(
      loadConfig({ SLUICE_FUTURE_KNOB: '!!', ADMISSION_SOMETHING: 'x', SIM_PROFILE: 'nope' }),
    ).toStrictEqual(DEFAULTS);
  });

  it('reads nothing when SLUICE_CONFIG is unset', () => {
    let reads = 0;
    loadConfig({}, () => {
      reads += 1;
      return '';
    });
    expect(reads).toBe(0);
  });

  it('ignores inherited properties of the environment object', () => {
    const env = Object.create({ PORT: 'not a port' }) as Record<string, string>;
    expect(loadConfig(env).http.port).toBe(8080);
  });

  it('returns a fresh object each time', () => {
    const a = loadConfig({});
    a.http.port = 1;
    expect(loadConfig({}).http.port).toBe(8080);
  });
});
