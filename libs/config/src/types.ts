// The validated configuration every app receives. Plain data: no methods, no I/O.

export interface EngineConfig {
  /** Unique across all pools; the `engine` metric label. Defaults to the URL's `host:port`. */
  name: string;
  /** Origin (`http://host:port`, no path or trailing slash); apps append `/v1/...` and `/metrics`. */
  url: string;
  /** Hard cap on requests in flight on this engine. */
  maxInflight: number;
  /**
   * Where `maxInflight` came from. Only a `default` cap (no file value, no variable) follows the
   * engine's own `max_num_seqs` once a scrape shows it; a cap someone wrote is kept.
   */
  capSource: MaxInflightSource;
  /** Bearer token gateways (model cards, discovery, tokenizer routes) and dispatchers send to this engine. */
  apiKey?: string;
  /** Which prompts the engine takes: `long` only long ones, `short` only short ones, `any` both. */
  lane: EngineLane;
}

export type EngineLane = 'any' | 'long' | 'short';

/** Prefill-aware admission of one pool (docs/broker.md). Structurally `@sluice/admission`'s `LongPromptPolicy`. */
export interface LongPromptConfig {
  /** A prompt estimated above this many tokens is long. */
  thresholdTokens: number;
  /** Share of an engine's slots long prompts may hold, in (0, 1]; at least one slot. */
  maxShare: number;
  /** Long prompts in prefill at once per engine. */
  maxInPrefill: number;
  /** Longest time short prompts may pass a long one, seconds. */
  agingSeconds: number;
  /** Release a long prompt only where it fits the engine's free KV tokens. */
  kvFit: boolean;
}

export interface PoolConfig {
  /** `[a-z0-9-]+`, unique; names the pool's queue, lease and metrics. */
  name: string;
  /** Model names routed to this pool. Empty only for the `VLLM_URL` pool whose model the app discovers. */
  models: string[];
  engines: EngineConfig[];
  /** Queued requests before new ones are refused. */
  queueDepth: number;
  /** Longest wait in the queue, seconds. */
  maxParkSeconds: number;
  /** Shorter answers under load (DESIGN, Policy: degradation); always present, defaults filled. */
  degradation: DegradationConfig;
  /** Long prompts' share of the engines, one prefill at a time, KV fit, aging. */
  longPrompts: LongPromptConfig;
  /**
   * The engines load LoRA adapters on first use (a vLLM LoRA resolver plugin): a model name
   * routed nowhere else comes here, for the engine to resolve or answer 404. One pool at most.
   */
  loraResolver?: true;
}

/** A load reading that can drive degradation: KV-cache usage, GPU utilization, queue pressure. */
export type DegradationSignal = 'kv' | 'gpu' | 'queue';

/** How the instruction reaches a chat request. */
export type SystemPromptMode = 'prepend' | 'append';

/** One load state. Structurally an `@sluice/admission` `LoadProfile`. */
export interface DegradationProfile {
  /** `[a-z0-9_-]`, unique in its list; the `x-sluice-load-state` value and `state` label. */
  name: string;
  /** Entered when the smoothed signal is at or above this (0..1); the first profile has 0. */
  threshold: number;
  /** System instruction for requests released in this state; absent = none. */
  instruction?: string;
  /** `max_tokens` is multiplied by this, in (0, 1]; 1 leaves it untouched. */
  maxTokensFactor: number;
}

/** A pool's degradation settings, resolved: defaults, then the file's top level, then the pool. */
export interface DegradationConfig {
  enabled: boolean;
  /** The signal is the maximum of these readings (those available at the moment). */
  signal: readonly DegradationSignal[];
  /** EMA weight of a new reading, in (0, 1]. */
  alpha: number;
  /** Margin below a state's threshold the smoothed signal must fall under to leave it. */
  hysteresis: number;
  /** Floor of a scaled `max_tokens` (never above what the client asked for). */
  minMaxTokens: number;
  /**
   * No longer used: a request without a limit gets none (an added one could exceed
   * max_model_len, which vLLM refuses). Still read, so that files setting it load.
   */
  defaultMaxTokens: number;
  /** Where the instruction joins a leading system message's text: in front (`prepend`) or after it (`append`); without one, in front of the first user message's text. */
  systemPrompt: SystemPromptMode;
  /** `/v1/completions`: put `<instruction>\n\n` in front of the prompt; false = untouched. */
  completionPrefix: boolean;
  /** Honour the `x-sluice-degrade: off` request header. */
  allowOptOut: boolean;
  /** Ascending thresholds, the first at 0. */
  profiles: readonly DegradationProfile[];
}

/** An ungated backend (embeddings, Ollama, ...): requests for `model` are proxied straight to `url`. */
export interface PassthroughConfig {
  model: string;
  url: string;
  /** Bearer token the gateway sends to this backend; the client's own is never forwarded. */
  apiKey?: string;
}

/** One tenant of the YAML file's `tenants` list (docs/broker.md, "Tenants and fair share"). */
export interface TenantConfig {
  /** `[A-Za-z0-9_.-]{1,63}`, unique; the `tenant` metric label and the job's `tenant`. */
  name: string;
  /** Lower-case hex SHA-256 digests of the tenant's API keys (plain keys are hashed on load). */
  keySha256: string[];
  /** Share of the engine relative to other busy tenants, > 0; default 1. */
  weight: number;
  /** Queued (not yet released) requests per pool before 429 `tenant_queue_full`; absent: no bound of its own. */
  maxQueued?: number;
  /** Highest `x-sluice-priority` this tenant may use (higher values are clamped); default 0. */
  maxPriority: number;
}

export type GpuSource = 'none' | 'nvml' | 'dcgm' | 'nvidia-smi' | 'mock';

/** Where an engine's cap came from: `config` when the pools file writes it (engine, shared or pool). */
export type MaxInflightSource =
  'ADMISSION_MAX_INFLIGHT' | 'VLLM_MAX_NUM_SEQS' | 'default' | 'config';

/** One `host:port` of a Redis node or sentinel. */
export interface RedisAddress {
  host: string;
  port: number;
}

/** Credentials and TLS shared by every topology (a single node may carry them in its URL instead). */
export interface RedisAccess {
  /** ACL user on the data nodes. */
  username?: string;
  /** Password on the data nodes. */
  password?: string;
  /** PEM file of the CA to trust; TLS is on for every connection when set (a single node: `rediss://`). */
  tlsCaFile?: string;
}

/** Which Redis Sluice talks to (docs/redis.md); exactly one kind, chosen by the variables set. */
export type RedisTopology =
  | ({ kind: 'single'; url: string } & RedisAccess)
  | ({
      kind: 'sentinel';
      sentinels: RedisAddress[];
      /** The name the sentinels monitor the master under. */
      masterName: string;
      /** The sentinels' own password. */
      sentinelPassword?: string;
    } & RedisAccess)
  | ({ kind: 'cluster'; nodes: RedisAddress[] } & RedisAccess);

/** The topology plus the prefix of every key and channel. */
export type RedisConfig = RedisTopology & { prefix: string };

/**
 * The gateway's CORS (GATEWAY_CORS_*), with vLLM's meaning and defaults: Starlette's
 * CORSMiddleware, which vLLM's OpenAI server installs with `--allowed-origins`,
 * `--allowed-methods`, `--allowed-headers` and `--allow-credentials`.
 */
export interface CorsConfig {
  /** `*` (any), or exact origins as browsers send them (`https://app.example`); `[]` for none. */
  allowedOrigins: '*' | string[];
  /** `*` (DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT) or upper-case methods. */
  allowedMethods: '*' | string[];
  /** `*` (whatever a preflight asks for) or header names, besides the CORS-safelisted ones. */
  allowedHeaders: '*' | string[];
  /** `Access-Control-Allow-Credentials: true` on every CORS answer. */
  allowCredentials: boolean;
}

export interface SluiceConfig {
  redis: RedisConfig;
  http: {
    host: string;
    port: number;
    metricsPort: number;
    /** GATEWAY_METRICS_PORT: the gateway serves `/metrics` there instead of on `port`. */
    gatewayMetricsPort?: number;
    /**
     * GATEWAY_TRUST_PROXY: proxies whose `X-Forwarded-For` the gateway believes (Fastify's
     * `trustProxy`); absent: the client address is the connection's peer.
     */
    trustProxy?: string[];
  };
  /** The gateway's answers to browsers' cross-origin requests. */
  cors: CorsConfig;
  /**
   * GATEWAY_AUTH_FAILURE_*: with tenants, an address that presented `limit` wrong keys within
   * `windowSeconds` gets 429 `auth_throttled` until the window ends (per replica; `limit` 0:
   * off); at most `maxAddresses` addresses are counted at once.
   */
  authFailures: { limit: number; windowSeconds: number; maxAddresses: number };
  pools: PoolConfig[];
  passthrough: PassthroughConfig[];
  /** Absent: no keys are asked for and every request is the anonymous tenant's. */
  tenants?: TenantConfig[];
  /**
   * SLUICE_TENANT_CACHE_SALT: with tenants, each completion request carries its tenant's own
   * vLLM `cache_salt` (the gateway's cache-salt.ts); no effect without tenants.
   */
  tenantCacheSalt: boolean;
  /**
   * SLUICE_TENANT_ENGINE_DETAILS: with tenants, whether answers name the engine
   * (`x-sluice-engine`, engine failures' messages); no effect without tenants.
   */
  tenantEngineDetails: boolean;
  admission: {
    kvThreshold: number;
    failMode: 'open' | 'closed';
    /** ADMISSION_FROZEN_GAUGES_SECONDS: after this long unchanged, gauges count as frozen; 0 never. */
    frozenGaugesSeconds: number;
  };
  limits: {
    maxBodyBytes: number;
    /** From this size (bytes) a body travels in a key of its own (JobPayload `bodyInKey`). */
    bodyKeyMinBytes: number;
    heartbeatSeconds: number;
    slowClientBytes: number;
    /** Receiving one request (headers and body), not answering it. */
    requestTimeoutSeconds: number;
    /** Seconds a client's socket may go without draining before its request is cut. */
    slowClientStallSeconds: number;
    /** Seconds the gateway's reply connection may be down before held clients are answered. */
    redisLossGraceSeconds: number;
    /** Seconds a gateway keeps serving held requests after SIGTERM. */
    shutdownDrainSeconds: number;
    /** Lower-cased header name. */
    priorityHeader: string;
    maxPriority: number;
  };
  relay: { livenessMs: number; silenceTimeoutMs: number };
  lease: { ttlMs: number };
  replica: { id?: string; ttlMs: number };
  dispatcher: {
    id?: string;
    /** SLUICE_POOLS: the pools this dispatcher may lead, each a configured pool; absent: all. */
    pools?: string[];
    /** SLUICE_MAX_LEASED_POOLS: most pools led at once; absent: no limit. */
    maxLeasedPools?: number;
  };
  engine: {
    scrapeIntervalMs: number;
    staleAfterFailures: number;
    headersTimeoutMs: number;
    bodyTimeoutMs: number;
  };
  gpu: { source: GpuSource; dcgmUrl?: string };
  logLevel: string;
  /** SLUICE_ACCESS_LOG: the gateway writes one line per completion request. */
  accessLog: boolean;
}
