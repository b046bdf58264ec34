// Per-variable test cases, keyed by variable name so a test can check that every variable
// in the table has them.
import type { SluiceConfig } from '../src/index.js';
import type { VariableName } from '../src/variables.js';

/** Where each variable lands in the config (for the single-engine pool where relevant). */
export const select: Record<VariableName, (config: SluiceConfig) => unknown> = {
  SLUICE_CONFIG: (c) => c.pools.map((p) => p.name),
  REDIS_URL: (c) => c.redis.url,
  SLUICE_REDIS_PREFIX: (c) => c.redis.prefix,
  HOST: (c) => c.http.host,
  PORT: (c) => c.http.port,
  METRICS_PORT: (c) => c.http.metricsPort,
  VLLM_URL: (c) => c.pools[0]?.engines[0]?.url,
  VLLM_MODEL: (c) => c.pools[0]?.models,
  VLLM_API_KEY: (c) => c.pools[0]?.engines[0]?.apiKey,
  VLLM_MAX_NUM_SEQS: (c) => c.pools[0]?.engines[0]?.maxInflight,
  ADMISSION_MAX_INFLIGHT: (c) => c.pools[0]?.engines[0]?.maxInflight,
  ADMISSION_KV_THRESHOLD: (c) => c.admission.kvThreshold,
  ADMISSION_MAX_PARK_SECONDS: (c) => c.pools[0]?.maxParkSeconds,
  VLLM_MAX_QUEUE_DEPTH: (c) => c.pools[0]?.queueDepth,
  ADMISSION_FAIL_MODE: (c) => c.admission.failMode,
  SLUICE_DEGRADATION: (c) => c.pools[0]?.degradation.enabled,
  MAX_BODY_BYTES: (c) => c.limits.maxBodyBytes,
  SSE_HEARTBEAT_SECONDS: (c) => c.limits.heartbeatSeconds,
  SLUICE_SLOW_CLIENT_BYTES: (c) => c.limits.slowClientBytes,
  SLUICE_PRIORITY_HEADER: (c) => c.limits.priorityHeader,
  SLUICE_MAX_PRIORITY: (c) => c.limits.maxPriority,
  ENGINE_SCRAPE_INTERVAL_MS: (c) => c.engine.scrapeIntervalMs,
  ENGINE_STALE_AFTER_FAILURES: (c) => c.engine.staleAfterFailures,
  ENGINE_HEADERS_TIMEOUT_MS: (c) => c.engine.headersTimeoutMs,
  ENGINE_BODY_TIMEOUT_MS: (c) => c.engine.bodyTimeoutMs,
  SLUICE_LEASE_TTL_MS: (c) => c.lease.ttlMs,
  SLUICE_RELAY_LIVENESS_MS: (c) => c.relay.livenessMs,
  SLUICE_RELAY_SILENCE_TIMEOUT_MS: (c) => c.relay.silenceTimeoutMs,
  SLUICE_REPLICA_TTL_MS: (c) => c.replica.ttlMs,
  SLUICE_REPLICA_ID: (c) => c.replica.id,
  SLUICE_DISPATCHER_ID: (c) => c.dispatcher.id,
  GPU_SOURCE: (c) => c.gpu.source,
  DCGM_URL: (c) => c.gpu.dcgmUrl,
  LOG_LEVEL: (c) => c.logLevel,
};

/** Values each variable must refuse. */
export const bad: Record<VariableName, string[]> = {
  SLUICE_CONFIG: [' /etc/sluice.yaml', '/etc/sluice.yaml\n'],
  REDIS_URL: [
    'http://127.0.0.1:6379',
    'localhost:6379',
    'redis://',
    'redis://host/abc',
    'redis://host/0/1',
    ' redis://host',
    'redis://host#x',
  ],
  SLUICE_REDIS_PREFIX: ['a b', '{a', 'a}', '{}', '{a}{b}', 'a/b', 'é', 'a.b'],
  HOST: ['a b', '[::1]', 'host/x', ' 0.0.0.0'],
  PORT: ['-1', '65536', '80.5', 'abc', '0x50', '1e3', ' 80', '80 ', '+-1'],
  METRICS_PORT: ['-1', '65536', '9464.0', 'metrics'],
  VLLM_URL: [
    'ftp://vllm:8000',
    'vllm:8000',
    'vllm',
    'http://vllm:8000/v1',
    'http://vllm:8000/v1/',
    'http://user:pass@vllm:8000',
    'http://vllm:8000?x=1',
    'http://vllm:8000#f',
    ' http://vllm:8000',
    'http://',
    'http://proxy/engines/a',
  ],
  VLLM_MODEL: [' llama', 'llama ', 'a\nb', '\t'],
  VLLM_API_KEY: ['a b', 'token\n', 'tökén'],
  VLLM_MAX_NUM_SEQS: ['0', '-1', '1.5', 'many'],
  ADMISSION_MAX_INFLIGHT: ['0', '-3', '2.5', 'ten', '9007199254740993', '4 '],
  ADMISSION_KV_THRESHOLD: ['1.5', '-0.1', 'NaN', 'Infinity', 'abc', '0x1', '.', '90%', '1.0000001'],
  ADMISSION_MAX_PARK_SECONDS: ['0', '-1', 'inf', '2147484', '2m'],
  VLLM_MAX_QUEUE_DEPTH: ['-1', '1.5', 'x'],
  ADMISSION_FAIL_MODE: ['maybe', 'opened', 'open '],
  SLUICE_DEGRADATION: ['true', 'false', 'yes', '0', 'of', ' on'],
  MAX_BODY_BYTES: ['1023', '1kb', '0'],
  SSE_HEARTBEAT_SECONDS: ['0', '-1', 'x', '0.0'],
  SLUICE_SLOW_CLIENT_BYTES: ['1023', '4MB'],
  SLUICE_PRIORITY_HEADER: ['x priority', 'x:p', 'é', 'x-p\n'],
  SLUICE_MAX_PRIORITY: ['-1', '2097152', '1.5'],
  ENGINE_SCRAPE_INTERVAL_MS: ['49', '0', '2147483648', '500ms'],
  ENGINE_STALE_AFTER_FAILURES: ['0', 'x'],
  ENGINE_HEADERS_TIMEOUT_MS: ['0', '2147483648', '15m'],
  ENGINE_BODY_TIMEOUT_MS: ['0', 'x'],
  SLUICE_LEASE_TTL_MS: ['499', 'x'],
  SLUICE_RELAY_LIVENESS_MS: ['9', 'x'],
  SLUICE_RELAY_SILENCE_TIMEOUT_MS: ['0', 'x'],
  SLUICE_REPLICA_TTL_MS: ['499', 'x'],
  SLUICE_REPLICA_ID: ['a:b', 'a b', 'x'.repeat(129), '{a}'],
  SLUICE_DISPATCHER_ID: ['a/b', 'é'],
  GPU_SOURCE: ['cuda', 'nvidia', 'nvml '],
  DCGM_URL: ['dcgm:9400', 'ftp://dcgm:9400/metrics', 'http://dcgm:9400/metrics?x'],
  LOG_LEVEL: ['verbose', 'warning'],
};

/**
 * A good value for each variable, what the config then holds, and any other variables the
 * case needs (an engine, so the pool-level values have somewhere to land).
 */
export const good: Record<
  VariableName,
  [raw: string, expected: unknown, env?: Record<string, string>][]
> = {
  SLUICE_CONFIG: [],
  REDIS_URL: [
    ['rediss://:s3cret@redis.internal:6380/2', 'rediss://:s3cret@redis.internal:6380/2'],
    ['redis://user:pw@10.0.0.1', 'redis://user:pw@10.0.0.1'],
    ['redis://[::1]:6379/', 'redis://[::1]:6379/'],
  ],
  SLUICE_REDIS_PREFIX: [
    ['{sluice}', '{sluice}'],
    ['team-a:sluice', 'team-a:sluice'],
    ['pre{tag}post', 'pre{tag}post'],
  ],
  HOST: [
    ['127.0.0.1', '127.0.0.1'],
    ['::', '::'],
    ['gateway.local', 'gateway.local'],
  ],
  PORT: [
    ['0', 0],
    ['65535', 65535],
    ['0080', 80],
  ],
  METRICS_PORT: [['9000', 9000]],
  VLLM_URL: [
    ['http://vllm-0:8000', 'http://vllm-0:8000'],
    ['HTTPS://VLLM.example/', 'https://vllm.example'],
    ['http://vllm:80', 'http://vllm'],
  ],
  VLLM_MODEL: [
    [
      'meta-llama/Llama-3.1-8B-Instruct',
      ['meta-llama/Llama-3.1-8B-Instruct'],
      { VLLM_URL: 'http://e:1' },
    ],
    ['my model', ['my model'], { VLLM_URL: 'http://e:1' }],
  ],
  VLLM_API_KEY: [['sk-abc.DEF_123', 'sk-abc.DEF_123', { VLLM_URL: 'http://e:1' }]],
  VLLM_MAX_NUM_SEQS: [['64', 64, { VLLM_URL: 'http://e:1' }]],
  ADMISSION_MAX_INFLIGHT: [
    ['1', 1, { VLLM_URL: 'http://e:1' }],
    ['1024', 1024, { VLLM_URL: 'http://e:1' }],
  ],
  ADMISSION_KV_THRESHOLD: [
    ['0', 0],
    ['1', 1],
    ['.85', 0.85],
    ['9.5e-1', 0.95],
  ],
  ADMISSION_MAX_PARK_SECONDS: [
    ['0.5', 0.5, { VLLM_URL: 'http://e:1' }],
    ['600', 600, { VLLM_URL: 'http://e:1' }],
  ],
  VLLM_MAX_QUEUE_DEPTH: [
    ['0', 0, { VLLM_URL: 'http://e:1' }],
    ['1000', 1000, { VLLM_URL: 'http://e:1' }],
  ],
  ADMISSION_FAIL_MODE: [
    ['closed', 'closed'],
    ['OPEN', 'open'],
  ],
  SLUICE_DEGRADATION: [
    ['off', false, { VLLM_URL: 'http://e:1' }],
    ['ON', true, { VLLM_URL: 'http://e:1' }],
  ],
  MAX_BODY_BYTES: [['1024', 1024]],
  SSE_HEARTBEAT_SECONDS: [
    ['0.05', 0.05],
    ['30', 30],
  ],
  SLUICE_SLOW_CLIENT_BYTES: [['65536', 65536]],
  SLUICE_PRIORITY_HEADER: [
    ['X-Priority', 'x-priority'],
    ['x_prio', 'x_prio'],
  ],
  SLUICE_MAX_PRIORITY: [
    ['0', 0],
    ['2097151', 2097151],
  ],
  ENGINE_SCRAPE_INTERVAL_MS: [['50', 50]],
  ENGINE_STALE_AFTER_FAILURES: [['1', 1]],
  ENGINE_HEADERS_TIMEOUT_MS: [['2147483647', 2147483647]],
  ENGINE_BODY_TIMEOUT_MS: [['1', 1]],
  SLUICE_LEASE_TTL_MS: [['500', 500]],
  SLUICE_RELAY_LIVENESS_MS: [['2499', 2499]],
  SLUICE_RELAY_SILENCE_TIMEOUT_MS: [['2001', 2001]],
  SLUICE_REPLICA_TTL_MS: [['30000', 30000]],
  SLUICE_REPLICA_ID: [['gateway-7c9f.default_0', 'gateway-7c9f.default_0']],
  SLUICE_DISPATCHER_ID: [['dispatcher-1', 'dispatcher-1']],
  GPU_SOURCE: [
    ['nvidia-smi', 'nvidia-smi'],
    ['NVML', 'nvml'],
    ['mock', 'mock'],
  ],
  DCGM_URL: [
    [
      'http://dcgm-exporter:9400/metrics',
      'http://dcgm-exporter:9400/metrics',
      { GPU_SOURCE: 'dcgm' },
    ],
    ['https://dcgm/metrics', 'https://dcgm/metrics'],
  ],
  LOG_LEVEL: [
    ['debug', 'debug'],
    ['SILENT', 'silent'],
  ],
};
