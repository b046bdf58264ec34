// The validated configuration every app receives. Plain data: no methods, no I/O.

export interface EngineConfig {
  /** Unique across all pools; the `engine` metric label. Defaults to the URL's `host:port`. */
  name: string;
  /** Origin (`http://host:port`, no path or trailing slash); apps append `/v1/...` and `/metrics`. */
  url: string;
  /** Hard cap on requests in flight on this engine. */
  maxInflight: number;
  /** Bearer token the dispatcher sends to this engine. */
  apiKey?: string;
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
}

/** An ungated backend (embeddings, Ollama, ...): requests for `model` are proxied straight to `url`. */
export interface PassthroughConfig {
  model: string;
  url: string;
}

export type GpuSource = 'none' | 'nvml' | 'dcgm' | 'nvidia-smi' | 'mock';

/**
 * Where the per-engine cap came from. For a YAML file this is the weakest source any engine
 * used: `config` only when every engine's cap is written in the file.
 */
export type MaxInflightSource =
  'ADMISSION_MAX_INFLIGHT' | 'VLLM_MAX_NUM_SEQS' | 'default' | 'config';

export interface SluiceConfig {
  redis: { url: string; prefix: string };
  http: { host: string; port: number; metricsPort: number };
  pools: PoolConfig[];
  passthrough: PassthroughConfig[];
  maxInflightSource: MaxInflightSource;
  admission: { kvThreshold: number; failMode: 'open' | 'closed' };
  limits: {
    maxBodyBytes: number;
    heartbeatSeconds: number;
    slowClientBytes: number;
    /** Lower-cased header name. */
    priorityHeader: string;
    maxPriority: number;
  };
  relay: { livenessMs: number; silenceTimeoutMs: number };
  lease: { ttlMs: number };
  replica: { id?: string; ttlMs: number };
  dispatcher: { id?: string };
  engine: {
    scrapeIntervalMs: number;
    staleAfterFailures: number;
    headersTimeoutMs: number;
    bodyTimeoutMs: number;
  };
  gpu: { source: GpuSource; dcgmUrl?: string };
  logLevel: string;
}
