// Every environment variable Sluice reads: one table, so names, defaults, validation and the
// README / --help text cannot drift apart. Each variable is defined here exactly once.
import { isIP } from 'node:net';
import { hidden, invalid, show } from './errors.js';
import {
  MAX_TIMER_MS,
  decimal,
  endpointUrl,
  integer,
  maskCredentials,
  maskListCredentials,
  matching,
  oneOf,
  originUrl,
  hostPortList,
  nameList,
  redisUrl,
  type Rule,
} from './rules.js';

/**
 * The cap when nothing better is known. vLLM's OpenAI server defaults `--max-num-seqs` to 256
 * on GPUs under 70 GiB and on A100s, and to 1024 on larger ones (H100, H200, MI300X):
 * `get_batch_defaults` in vllm/engine/arg_utils.py. The smaller one, so an engine of unknown
 * size is never overfilled; a scrape that shows the engine's own max_num_seqs replaces it.
 */
export const VLLM_DEFAULT_MAX_NUM_SEQS = 256;

const MAX_TIMER_SECONDS = Math.floor(MAX_TIMER_MS / 1000);

/**
 * Highest SLUICE_MAX_PRIORITY: each class takes three BullMQ priorities (aged long, short,
 * long; see `bullPriority` in @sluice/protocol) and BullMQ's highest is 2,097,152.
 */
export const MAX_PRIORITY = 699_049;

/** Rules shared by an environment variable and a field of the YAML file. */
export const shared = {
  maxInflight: integer(1),
  // 0 would refuse every request: the admission script refuses when queued >= this.
  queueDepth: integer(1),
  maxParkSeconds: decimal({ min: 0, exclusiveMin: true, max: MAX_TIMER_SECONDS }),
  longPromptTokens: integer(1),
  longMaxShare: decimal({ min: 0, exclusiveMin: true, max: 1 }),
  longMaxInPrefill: integer(1),
  longAgingSeconds: decimal({ min: 0, max: MAX_TIMER_SECONDS }),
  engineUrl: originUrl(),
  modelName: matching(
    /^[^\s\p{Cc}](?:[^\p{Cc}]*[^\s\p{Cc}])?$/u,
    'a non-empty model name without surrounding blanks or control characters',
  ),
  apiKey: matching(/^[\x21-\x7e]+$/, 'a token of visible ASCII characters (no blanks or newlines)'),
} as const;

export const GPU_SOURCES = ['none', 'nvml', 'dcgm', 'nvidia-smi', 'mock'] as const;
export const FAIL_MODES = ['open', 'closed'] as const;
export const SWITCH = ['on', 'off'] as const;
export const LOG_LEVELS = ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'] as const;

export interface Variable<T> extends Rule<T> {
  /** The value when the variable is unset or empty; none for optional or derived values. */
  readonly fallback?: T;
  /** The default column of the table, when it is not simply `fallback`. */
  readonly defaultText?: string;
  readonly help: string;
  /** How a raw value appears in an error message (secrets are never shown). */
  readonly display?: (raw: string) => string;
}

function v<T>(rule: Rule<T>, spec: Omit<Variable<NoInfer<T>>, keyof Rule<T>>): Variable<T> {
  return { ...rule, ...spec };
}

const ms = (min: number) => integer(min, MAX_TIMER_MS);
/** How a URL appears in a message: credentials written into it are `***` (maskCredentials). */
const maskedUrl = (raw: string) => show(maskCredentials(raw));
const maskedList = (raw: string) => show(maskListCredentials(raw));
const filePath = matching(/^\S(.*\S)?$/, 'a file path');
const secret = matching(/^[^\p{Cc}]+$/u, 'text without control characters');
const id = matching(/^[A-Za-z0-9._-]{1,128}$/, "1 to 128 letters, digits, '.', '_' or '-'");

/** `*`: CORS allows any origin, method or header (vLLM's default for each of the three). */
export const ANY = '*';

/**
 * `*` alone, `none` (when `none` is given: an empty list), or a comma-separated list of items
 * (blanks around the commas allowed), each parsed by `item`, no duplicates once parsed (`key`
 * says when two are the same). `*` among other items is refused: it would make them moot.
 */
function starOrList(
  item: (raw: string) => string | undefined,
  allowed: string,
  {
    none = false,
    key = (parsed: string) => parsed,
  }: { none?: boolean; key?: (parsed: string) => string } = {},
): Rule<typeof ANY | string[]> {
  const fromText = (raw: string): typeof ANY | string[] | undefined => {
    const text = raw.trim();
    if (text === ANY) return ANY;
    if (none && text === 'none') return [];
    const list: string[] = [];
    const seen = new Set<string>();
    for (const part of text.split(',').map((p) => p.trim())) {
      const parsed = part === ANY ? undefined : item(part);
      if (parsed === undefined || seen.has(key(parsed))) return undefined;
      seen.add(key(parsed));
      list.push(parsed);
    }
    return list;
  };
  return { allowed, fromText, fromValue: (v) => (typeof v === 'string' ? fromText(v) : undefined) };
}

/** proxy-addr's names for ranges (Fastify's trustProxy): 127/8 and ::1, 169.254/16 and fe80::/10, 10/8, 172.16/12, 192.168/16 and fc00::/7. */
const PROXY_RANGES = ['loopback', 'linklocal', 'uniquelocal'] as const;
/** One proxy address (`10.0.0.7`, `::1`), a CIDR range (`10.0.0.0/8`) or a PROXY_RANGES name. */
function proxyAddress(raw: string): string | undefined {
  if ((PROXY_RANGES as readonly string[]).includes(raw)) return raw;
  const [address = '', bits, ...more] = raw.split('/');
  const family = isIP(address);
  if (family === 0 || more.length > 0) return undefined;
  if (bits === undefined) return raw;
  return /^\d{1,3}$/.test(bits) && Number(bits) <= (family === 4 ? 32 : 128) ? raw : undefined;
}
const proxyListText = (raw: string): string[] | undefined => {
  const list = raw.split(',').map((part) => part.trim());
  if (list.some((part) => proxyAddress(part) === undefined) || new Set(list).size !== list.length)
    return undefined;
  return list;
};
const proxyList: Rule<string[]> = {
  allowed:
    'a comma-separated list of proxy addresses, CIDR ranges or loopback, linklocal, uniquelocal, without duplicates, e.g. 10.0.0.0/8,127.0.0.1',
  fromText: proxyListText,
  fromValue: (value) => (typeof value === 'string' ? proxyListText(value) : undefined),
};

const httpOrigin = originUrl().fromText;
/**
 * One origin as a browser sends it in `Origin` (the ASCII serialisation: `scheme://host[:port]`,
 * no path). http(s) ones are normalised as browsers write them (lower-case host, no default
 * port, no trailing slash: `HTTPS://App.example:443/` is `https://app.example`); another scheme
 * (`chrome-extension://id`, `tauri://localhost`) is kept as written. Compared exactly, as
 * Starlette's CORSMiddleware does, so `null` (sandboxed and file pages) is not accepted.
 */
function corsOrigin(raw: string): string | undefined {
  if (/^https?:/i.test(raw)) return httpOrigin(raw);
  return /^[a-z][a-z0-9+.-]*:\/\/[A-Za-z0-9._~%-]+(:\d{1,5})?$/.test(raw) ? raw : undefined;
}
const HTTP_METHOD = /^[A-Z]+$/;
// RFC 9110's token, as a header name.
const HEADER_NAME = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/;

export const VARIABLES = {
  SLUICE_CONFIG: v(filePath, {
    defaultText: 'unset',
    help: 'YAML file with pools, engines, pass-through models and degradation profiles (see the README); not together with VLLM_URL',
  }),
  REDIS_URL: v(redisUrl(), {
    fallback: 'redis://127.0.0.1:6379',
    help: 'Redis for the queue, reply channels and leases (a single node); may carry a password and a database number; leave unset with REDIS_SENTINELS or REDIS_CLUSTER_NODES',
    display: maskedUrl,
  }),
  REDIS_SENTINELS: v(hostPortList('10.0.0.1:26379,10.0.0.2:26379'), {
    defaultText: 'unset',
    help: 'Redis Sentinel: the sentinels to ask for the current master (with REDIS_SENTINEL_MASTER; REDIS_URL unset); see docs/redis.md',
    // A valid list holds no credentials, but someone may have written `:pw@host:port` there.
    display: maskedList,
  }),
  REDIS_SENTINEL_MASTER: v(id, {
    defaultText: 'unset',
    help: 'the master name the sentinels monitor; required with REDIS_SENTINELS',
  }),
  REDIS_SENTINEL_PASSWORD: v(secret, {
    defaultText: 'unset',
    help: "the sentinels' own password (requirepass of the sentinels), when they have one",
    display: hidden,
  }),
  REDIS_CLUSTER_NODES: v(hostPortList('10.0.0.1:6379,10.0.0.2:6379'), {
    defaultText: 'unset',
    help: 'Redis Cluster: seed nodes (any few masters or replicas; REDIS_URL unset); see docs/redis.md',
    display: maskedList,
  }),
  REDIS_USERNAME: v(matching(/^[\x21-\x7e]+$/, 'visible ASCII characters (no blanks)'), {
    defaultText: 'unset',
    help: 'ACL user on the Redis data nodes (Sentinel, Cluster, or a REDIS_URL without credentials)',
  }),
  REDIS_PASSWORD: v(secret, {
    defaultText: 'unset',
    help: 'password on the Redis data nodes (Sentinel, Cluster, or a REDIS_URL without credentials)',
    display: hidden,
  }),
  REDIS_TLS_CA_FILE: v(filePath, {
    defaultText: 'unset',
    help: 'PEM file of the CA to trust for Redis TLS: needs a rediss:// REDIS_URL; turns TLS on for sentinels and cluster nodes',
  }),
  SLUICE_REDIS_PREFIX: v(
    matching(
      /^[A-Za-z0-9_:-]*(\{[A-Za-z0-9_:-]+\})?[A-Za-z0-9_:-]*$/,
      'letters, digits, _ - : and at most one {hash tag}, e.g. sluice or {sluice}',
    ),
    {
      fallback: 'sluice',
      help: 'prefix of every Redis key and channel; keys are hash-tagged per pool already (docs/redis.md), a {tag} here puts every pool in one slot',
    },
  ),
  HOST: v(matching(/^[A-Za-z0-9._:%-]+$/, 'a host name or IP address (IPv6 without brackets)'), {
    fallback: '0.0.0.0',
    help: 'address the gateway HTTP server and the dispatcher metrics server listen on',
  }),
  PORT: v(integer(0, 65535), {
    fallback: 8080,
    help: 'gateway HTTP port (0 picks a free one)',
  }),
  METRICS_PORT: v(integer(0, 65535), {
    fallback: 9464,
    help: "dispatcher's /metrics and health port (0 picks a free one)",
  }),
  GATEWAY_METRICS_PORT: v(integer(0, 65535), {
    defaultText: 'unset',
    help: 'the gateway serves /metrics on this port (same HOST) instead of PORT, so only the API port faces clients; must differ from PORT (0 picks a free one)',
  }),
  // CORS as vLLM's OpenAI server has it: build_app in vllm/entrypoints/openai/api_server.py
  // adds Starlette's CORSMiddleware with --allowed-origins, --allow-credentials,
  // --allowed-methods and --allowed-headers, whose defaults in
  // vllm/entrypoints/openai/cli_args.py (FrontendArgs) are ["*"], false, ["*"], ["*"].
  GATEWAY_CORS_ALLOWED_ORIGINS: v(
    starOrList(
      corsOrigin,
      '* (any origin), none, or a comma-separated list of origins (scheme://host[:port], no path) without duplicates, e.g. https://chat.example.com,http://localhost:3000',
      { none: true },
    ),
    {
      fallback: ANY,
      // An origin has no credentials, but someone may have written `user:pw@` into one.
      display: maskedList,
      help: "origins whose web pages may call the gateway (CORS, vLLM's --allowed-origins); none answers no origin; a preflight needs no API key, the request itself does",
    },
  ),
  GATEWAY_CORS_ALLOWED_METHODS: v(
    starOrList(
      (raw) => (HTTP_METHOD.test(raw) ? raw : undefined),
      '* (DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT) or a comma-separated list of upper-case methods without duplicates, e.g. GET,POST',
    ),
    {
      fallback: ANY,
      help: "methods a CORS preflight may ask for (vLLM's --allowed-methods)",
    },
  ),
  GATEWAY_CORS_ALLOWED_HEADERS: v(
    starOrList(
      (raw) => (HEADER_NAME.test(raw) ? raw : undefined),
      '* (any) or a comma-separated list of header names without duplicates, e.g. Authorization,X-Sluice-Priority',
      { key: (name) => name.toLowerCase() },
    ),
    {
      fallback: ANY,
      help: "request headers a CORS preflight may ask for besides Accept, Accept-Language, Content-Language and Content-Type (vLLM's --allowed-headers); list Authorization where tenants need keys",
    },
  ),
  GATEWAY_CORS_ALLOW_CREDENTIALS: v(oneOf(SWITCH), {
    fallback: 'off',
    help: "Access-Control-Allow-Credentials: true on CORS answers (vLLM's --allow-credentials); with origins *, a preflight and a request with a Cookie get the request's own origin back, as Starlette does",
  }),
  // Failed key checks per client address (apps/gateway/src/auth-throttle.ts): in-process, so
  // each replica counts its own.
  GATEWAY_AUTH_FAILURE_LIMIT: v(integer(0), {
    fallback: 20,
    help: 'with tenants, wrong API keys one client address may present to a gateway replica within GATEWAY_AUTH_FAILURE_WINDOW_SECONDS; past them it gets 429 auth_throttled, its key not checked, until that window ends (each replica counts its own); 0 turns the throttle off',
  }),
  GATEWAY_AUTH_FAILURE_WINDOW_SECONDS: v(
    decimal({ min: 0, exclusiveMin: true, max: MAX_TIMER_SECONDS }),
    {
      fallback: 60,
      help: "the window of GATEWAY_AUTH_FAILURE_LIMIT, from an address's first wrong key; Retry-After says when it ends",
    },
  ),
  GATEWAY_AUTH_FAILURE_ADDRESSES: v(integer(1), {
    fallback: 100_000,
    help: 'client addresses (IPv6: /64 prefixes) whose wrong keys a replica counts at once (11-14 MB at the default); past it the window that began first is dropped',
  }),
  GATEWAY_TRUST_PROXY: v(proxyList, {
    defaultText: 'unset',
    help: "proxies (an ingress, a load balancer) whose X-Forwarded-For names the client (Fastify's trustProxy); unset, the client address is the connection's peer, and behind a proxy every client shares the proxy's address, its wrong keys too (GATEWAY_AUTH_FAILURE_LIMIT)",
  }),
  VLLM_URL: v(shared.engineUrl, {
    defaultText: 'unset',
    // Refused with credentials in it, but not shown with them.
    display: maskedUrl,
    help: 'origin of one engine, for the single-pool case (a pool named default)',
  }),
  VLLM_MODEL: v(shared.modelName, {
    defaultText: 'discovered',
    help: 'the model VLLM_URL serves; when unset the app asks the engine (/v1/models)',
  }),
  VLLM_API_KEY: v(shared.apiKey, {
    defaultText: 'unset',
    help: 'bearer token gateways and dispatchers send to engines (also for file engines without apiKey)',
    display: hidden,
  }),
  VLLM_MAX_NUM_SEQS: v(integer(1), {
    defaultText: 'unset',
    help: "the engine's --max-num-seqs; the per-engine cap when ADMISSION_MAX_INFLIGHT is unset",
  }),
  ADMISSION_MAX_INFLIGHT: v(shared.maxInflight, {
    defaultText: `VLLM_MAX_NUM_SEQS, else ${VLLM_DEFAULT_MAX_NUM_SEQS}`,
    help: `hard cap on requests in flight per engine; set it to the engine's --max-num-seqs (vLLM defaults to ${VLLM_DEFAULT_MAX_NUM_SEQS}, or 1024 on GPUs of 70 GiB or more other than A100)`,
  }),
  // Above 0: at 0 the gate is closed whenever the gauges are fresh, and nothing is released.
  ADMISSION_KV_THRESHOLD: v(decimal({ min: 0, exclusiveMin: true, max: 1 }), {
    fallback: 0.9,
    help: "the gate closes at or above this KV-cache usage (engine's own gauge)",
  }),
  ADMISSION_MAX_PARK_SECONDS: v(shared.maxParkSeconds, {
    fallback: 120,
    help: 'longest wait in the queue before a request is refused with 503',
  }),
  VLLM_MAX_QUEUE_DEPTH: v(shared.queueDepth, {
    fallback: 8,
    help: 'queued requests per pool before new ones are refused (every request passes the queue, so 0 would refuse them all)',
  }),
  ADMISSION_LONG_PROMPT_TOKENS: v(shared.longPromptTokens, {
    fallback: 8192,
    help: "prompts estimated above this many tokens are long (vLLM's default per-step budget on GPUs of 70 GiB or more other than A100; 2048 on smaller ones); see docs/broker.md",
  }),
  ADMISSION_LONG_MAX_SHARE: v(shared.longMaxShare, {
    fallback: 0.5,
    help: "share of an engine's slots long prompts may hold (rounded down, at least one)",
  }),
  ADMISSION_LONG_MAX_PREFILLS: v(shared.longMaxInPrefill, {
    fallback: 1,
    help: 'long prompts in prefill (released, no first byte yet) at once per engine',
  }),
  ADMISSION_LONG_AGING_SECONDS: v(shared.longAgingSeconds, {
    fallback: 60,
    help: 'longest time short prompts may pass a waiting long one',
  }),
  ADMISSION_LONG_KV_FIT: v(oneOf(SWITCH), {
    fallback: 'on',
    help: "release a long prompt only where its estimate fits the engine's free KV tokens",
  }),
  ADMISSION_FAIL_MODE: v(oneOf(FAIL_MODES), {
    fallback: 'open',
    help: 'gauge conditions while the engine state is unknown; the in-flight cap holds either way',
  }),
  // vLLM v1 refreshes its gauges only when it steps, and steps only with requests: after every
  // request is aborted at once they stay as they were (vllm-project/vllm#22545, #29928). Measured
  // between scrapes, so it is never shorter than ENGINE_SCRAPE_INTERVAL_MS. docs/broker.md.
  ADMISSION_FROZEN_GAUGES_SECONDS: v(decimal({ min: 0, max: MAX_TIMER_SECONDS }), {
    fallback: 10,
    help: "gauges that would close the gate, with nothing of Sluice's in flight on the engine, count as frozen once neither they nor its step counter changed for this long, and one probe request goes (vLLM stops refreshing them when all its requests are aborted at once); keep it several scrape intervals and above the engine's longest step; 0 never probes",
  }),
  SLUICE_DEGRADATION: v(oneOf(SWITCH), {
    fallback: 'on',
    help: 'shorter answers under load for the VLLM_URL pool; off also switches off every SLUICE_CONFIG pool',
  }),
  MAX_BODY_BYTES: v(integer(1024), {
    // vLLM sets none; a base64 image of a few MB must fit. Queued bodies live in Redis: a pool
    // holds at most VLLM_MAX_QUEUE_DEPTH of them.
    fallback: 8 * 1_048_576,
    help: 'request body limit (413 above it); queued bodies are kept in Redis, up to VLLM_MAX_QUEUE_DEPTH of this per pool',
  }),
  SLUICE_BODY_KEY_MIN_BYTES: v(integer(0), {
    fallback: 65_536,
    help: 'bodies from this size travel raw in a Redis key of their own, not base64 in the job',
  }),
  SSE_HEARTBEAT_SECONDS: v(decimal({ min: 0, exclusiveMin: true, max: MAX_TIMER_SECONDS }), {
    fallback: 15,
    help: 'keep-alive comment period for waiting streams (fractions allowed)',
  }),
  SLUICE_SLOW_CLIENT_BYTES: v(integer(1024), {
    fallback: 4_194_304,
    help: 'bytes of a stream buffered for one slow client before its request is cancelled (a non-streamed answer, whose engine work is done, is held only to the stall limit)',
  }),
  GATEWAY_REQUEST_TIMEOUT_SECONDS: v(
    decimal({ min: 0, exclusiveMin: true, max: MAX_TIMER_SECONDS }),
    {
      fallback: 30,
      help: 'longest time a client may take to send its request (headers and body; 408 after it); the response is not timed',
    },
  ),
  SLUICE_SLOW_CLIENT_STALL_SECONDS: v(
    decimal({ min: 0, exclusiveMin: true, max: MAX_TIMER_SECONDS }),
    {
      fallback: 30,
      help: 'a client that has taken no bytes of its answer for this long is cut and its engine request cancelled',
    },
  ),
  SLUICE_REDIS_LOSS_GRACE_SECONDS: v(
    decimal({ min: 0, exclusiveMin: true, max: MAX_TIMER_SECONDS }),
    {
      // 4, so that with detection and the answer itself every held client hears within 5 s.
      fallback: 4,
      help: "held clients get 503 redis_unavailable (or an in-band error) once the gateway's reply connection has been down this long, or Redis has not answered its probe this long (stopped, partitioned); the dispatcher then cancels the engine requests nobody can receive",
    },
  ),
  SLUICE_SHUTDOWN_DRAIN_SECONDS: v(decimal({ min: 0, max: MAX_TIMER_SECONDS }), {
    fallback: 25,
    help: "on SIGTERM the gateway serves its held streams this long, then refuses or cuts what is left; keep it under the pod's terminationGracePeriodSeconds",
  }),
  SLUICE_PRIORITY_HEADER: v(
    matching(
      /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/,
      'an HTTP header name such as x-sluice-priority',
      (raw) => raw.toLowerCase(),
    ),
    { fallback: 'x-sluice-priority', help: 'request header carrying a priority (lower-cased)' },
  ),
  SLUICE_MAX_PRIORITY: v(integer(0, MAX_PRIORITY), {
    fallback: 10,
    help: 'priority header values are clamped into 0..this (0 turns priorities off; at most 3 BullMQ levels a class fit)',
  }),
  // vLLM's per-request `cache_salt` (chat completions and completions) goes into the hash of a
  // prompt's first KV block (vllm/v1/core/kv_cache_utils.py `generate_block_hash_extra_keys`),
  // so requests with different salts never share cached blocks. See apps/gateway/src/cache-salt.ts.
  SLUICE_TENANT_CACHE_SALT: v(oneOf(SWITCH), {
    fallback: 'on',
    help: "with tenants, the gateway sets every completion request's vLLM cache_salt to its tenant's own (replacing any the client sent), so tenants share no prefix-cache blocks and none can time another's prompts; off lets tenants that send the same long prefix (a shared system prompt) hit each other's cache again, and so learn what other tenants sent (docs/broker.md)",
  }),
  // Tenants are other teams or customers: an engine's name defaults to its host and port, and
  // an engine failure's cause (undici's) names its address, neither of which is theirs to see.
  SLUICE_TENANT_ENGINE_DETAILS: v(oneOf(SWITCH), {
    fallback: 'off',
    help: "with tenants, on lets answers name the engine that served them (x-sluice-engine) and say what failed in an engine failure's message (its name, address and cause); off leaves both out and gives the engine failures a fixed message, the access log keeping the full one (detail); no effect without tenants",
  }),
  ENGINE_SCRAPE_INTERVAL_MS: v(ms(50), {
    fallback: 500,
    help: 'engine /metrics poll period',
  }),
  ENGINE_STALE_AFTER_FAILURES: v(integer(1), {
    fallback: 3,
    help: 'consecutive failed polls before the engine state is unknown',
  }),
  ENGINE_HEADERS_TIMEOUT_MS: v(ms(1), {
    fallback: 900_000,
    help: "longest wait for an engine's response head and, after it, for the first byte of its body, then engine_timeout (504, in-band once a stream has started): for a non-streamed request the whole generation (vLLM sends that head with the complete answer), for a stream its prefill (vLLM sends a stream's head at once and the first token after the prefill: minutes on a long prompt)",
  }),
  ENGINE_BODY_TIMEOUT_MS: v(ms(1), {
    fallback: 300_000,
    help: "longest gap between two chunks of an engine response after the first (the wait for the first is ENGINE_HEADERS_TIMEOUT_MS's), then the answer breaks off with engine_error",
  }),
  SLUICE_LEASE_TTL_MS: v(ms(500), {
    fallback: 5000,
    help: "TTL of a dispatcher's pool lease; a standby takes over this long after the leader dies",
  }),
  SLUICE_RELAY_LIVENESS_MS: v(ms(10), {
    fallback: 1000,
    help: 'the dispatcher sends a liveness frame for a request after this long without one',
  }),
  SLUICE_RELAY_SILENCE_TIMEOUT_MS: v(ms(1), {
    fallback: 5000,
    help: 'the gateway fails a request whose dispatcher has been silent this long (> 2 x liveness)',
  }),
  SLUICE_REPLICA_TTL_MS: v(ms(500), {
    fallback: 5000,
    help: "TTL of a gateway replica's liveness key; the dispatcher skips jobs of a dead replica",
  }),
  SLUICE_REPLICA_ID: v(id, {
    defaultText: 'generated',
    help: "name of this gateway replica; each process adds a random suffix of its own (`<name>.<8 hex>`, as logs and /healthz show it) for its reply channel and liveness key, so one restarted under the same name does not take over the dead process's queued requests",
  }),
  SLUICE_DISPATCHER_ID: v(id, {
    defaultText: 'generated',
    help: 'name of this dispatcher (lease holder)',
  }),
  SLUICE_POOLS: v(
    nameList(
      /^[a-z0-9-]+$/,
      'a comma-separated list of pool names of the config, without duplicates, e.g. chat,code',
    ),
    {
      defaultText: 'all pools',
      help: 'the pools this dispatcher may lead; it has no lease, worker or metrics for the others',
    },
  ),
  SLUICE_MAX_LEASED_POOLS: v(integer(1), {
    defaultText: 'no limit',
    help: 'how many pools this dispatcher leads at once; at the limit it does not contend for more',
  }),
  GPU_SOURCE: v(oneOf(GPU_SOURCES), {
    fallback: 'none',
    help: 'where the dispatcher reads GPU load',
  }),
  DCGM_URL: v(endpointUrl('http://dcgm-exporter:9400/metrics'), {
    defaultText: 'unset',
    display: maskedUrl,
    help: "dcgm-exporter's metrics URL; required when GPU_SOURCE=dcgm",
  }),
  LOG_LEVEL: v(oneOf(LOG_LEVELS), { fallback: 'info', help: 'pino log level' }),
  SLUICE_ACCESS_LOG: v(oneOf(SWITCH), {
    fallback: 'on',
    help: "the gateway's access log: one info line per completion request (the metrics stay either way)",
  }),
} as const;

export type VariableName = keyof typeof VARIABLES;
export type ValueOf<N extends VariableName> =
  (typeof VARIABLES)[N] extends Variable<infer T> ? T : never;

/** The variables after validation: each is its parsed value, its fallback, or unset. */
export interface EnvValues {
  /** The parsed value, or the fallback when unset. */
  get<N extends VariableName>(name: N): ValueOf<N> | undefined;
  /** Like `get`, for variables that have a fallback. */
  must<N extends VariableName>(name: N): ValueOf<N>;
  /** Whether the environment set it (an empty value counts as unset). */
  isSet(name: VariableName): boolean;
  /** How the raw value appears in a message (secrets hidden). */
  shown(name: VariableName): string;
}

const names = Object.keys(VARIABLES) as VariableName[];

/**
 * Parses every variable in table order and throws `ConfigError` at the first bad one.
 * An empty value counts as unset (as `FOO=` in a compose file usually means).
 */
export function readVariables(env: Readonly<Record<string, string | undefined>>): EnvValues {
  const values = new Map<VariableName, unknown>();
  const raws = new Map<VariableName, string>();
  for (const name of names) {
    const spec: Variable<unknown> = VARIABLES[name];
    const raw = Object.hasOwn(env, name) ? env[name] : undefined;
    if (raw === undefined || raw === '') {
      if (spec.fallback !== undefined) values.set(name, spec.fallback);
      continue;
    }
    const value = spec.fromText(raw);
    if (value === undefined) throw invalid(name, (spec.display ?? show)(raw), spec.allowed);
    values.set(name, value);
    raws.set(name, raw);
  }
  const get = <N extends VariableName>(name: N) => values.get(name) as ValueOf<N> | undefined;
  return {
    get,
    must(name) {
      const value = get(name);
      if (value === undefined) throw new Error(`internal: ${name} has no fallback`);
      return value;
    },
    isSet: (name) => raws.has(name),
    shown(name) {
      const raw = raws.get(name);
      return raw === undefined ? 'unset' : (VARIABLES[name].display ?? show)(raw);
    },
  };
}

const cell = (text: string) => text.replaceAll('|', '\\|');

/**
 * A Markdown table of every variable: name, default, what is allowed and what it means.
 * The README embeds it verbatim (a test keeps the two equal); CLIs print it for --help.
 */
export function describeVariables(): string {
  const rows = names.map((name) => {
    const spec: Variable<unknown> = VARIABLES[name];
    const fallback =
      spec.defaultText ?? (spec.fallback === undefined ? 'unset' : `\`${String(spec.fallback)}\``);
    return `| \`${name}\` | ${cell(fallback)} | ${cell(spec.allowed)} | ${cell(spec.help)} |`;
  });
  return ['| variable | default | allowed | meaning |', '| --- | --- | --- | --- |', ...rows].join(
    '\n',
  );
}
