// Command line and environment for the simulator: one table, so flags, env names,
// validation and --help cannot drift apart. Precedence: flag, then env, then profile.
import { profiles, profileNames, type EngineProfile, type ProfileName } from './profiles.js';

export interface SimOptions extends EngineProfile {
  profile: ProfileName;
  host: string;
  port: number;
  /** Simulated seconds per wall-clock second. */
  timeScale: number;
  /** Expose `vllm:gpu_cache_usage_perc` (vLLM < 0.10) instead of `vllm:kv_cache_usage_perc`. */
  legacyKvMetric: boolean;
  /** Wall-clock seconds during which /health answers 503 and requests are refused. */
  startupDelaySeconds: number;
  /** vLLM `--long-prefill-token-threshold`: most prompt tokens of one request per step; 0 = off. */
  longPrefillTokenThreshold: number;
  /** Admit on the first chunk instead of the whole prompt (vLLM V1 before PR #37307). */
  firstChunkAdmission: boolean;
  /** vLLM `--enable-prefix-caching` / `--no-enable-prefix-caching` (V1 default on). */
  enablePrefixCaching: boolean;
  /** vLLM `--scheduling-policy`. */
  schedulingPolicy: 'fcfs' | 'priority';
  /** vLLM `--api-key` / `VLLM_API_KEY`: `/v1/*` requests need `Authorization: Bearer <key>`. */
  apiKey?: string;
  /**
   * Publish the gauges as vLLM v1 does: from a snapshot taken at the end of each step, so that
   * an engine that runs no step (it holds no request) refreshes nothing, and an abort that comes
   * during a step takes effect after it. Off: the gauges are read live.
   */
  metricsPerStep: boolean;
  /**
   * Comma-separated LoRA adapter names a resolver plugin would find: the first request naming
   * one loads it (then `/v1/models` lists it), as vLLM does with VLLM_ALLOW_RUNTIME_LORA_UPDATING
   * and a resolver; any other unknown name is answered 404.
   */
  loraResolverAdapters?: string;
}

export class SimConfigError extends Error {
  readonly code = 'ERR_SIM_CONFIG';
}

type Kind = 'int' | 'number' | 'bool' | 'negbool' | 'string' | 'secret' | 'profile' | 'policy';

interface OptionSpec {
  flag: string;
  env: string;
  key: keyof SimOptions;
  kind: Kind;
  min?: number;
  /** Strictly greater than `min` rather than at least. */
  exclusiveMin?: boolean;
  help: string;
}

const specs: OptionSpec[] = [
  {
    flag: 'profile',
    env: 'SIM_PROFILE',
    key: 'profile',
    kind: 'profile',
    help: `engine profile: ${profileNames.join(', ')}`,
  },
  { flag: 'host', env: 'HOST', key: 'host', kind: 'string', help: 'address to listen on' },
  {
    flag: 'port',
    env: 'PORT',
    key: 'port',
    kind: 'int',
    min: 0,
    help: 'port to listen on (0 picks a free one)',
  },
  {
    flag: 'time-scale',
    env: 'SIM_TIME_SCALE',
    key: 'timeScale',
    kind: 'number',
    min: 0,
    exclusiveMin: true,
    help: 'simulated seconds per real second',
  },
  { flag: 'model', env: 'SIM_MODEL', key: 'model', kind: 'string', help: 'served model name' },
  {
    flag: 'max-num-seqs',
    env: 'SIM_MAX_NUM_SEQS',
    key: 'maxNumSeqs',
    kind: 'int',
    min: 1,
    help: 'sequences per batch (vLLM --max-num-seqs)',
  },
  {
    flag: 'max-num-batched-tokens',
    env: 'SIM_MAX_NUM_BATCHED_TOKENS',
    key: 'maxNumBatchedTokens',
    kind: 'int',
    min: 1,
    help: 'token budget per scheduler step',
  },
  {
    flag: 'num-gpu-blocks',
    env: 'SIM_NUM_GPU_BLOCKS',
    key: 'numGpuBlocks',
    kind: 'int',
    min: 1,
    help: 'KV cache blocks',
  },
  {
    flag: 'block-size',
    env: 'SIM_BLOCK_SIZE',
    key: 'blockSize',
    kind: 'int',
    min: 1,
    help: 'tokens per KV block',
  },
  {
    flag: 'max-model-len',
    env: 'SIM_MAX_MODEL_LEN',
    key: 'maxModelLen',
    kind: 'int',
    min: 1,
    help: 'prompt + completion limit per request',
  },
  {
    flag: 'step-overhead-seconds',
    env: 'SIM_STEP_OVERHEAD_SECONDS',
    key: 'stepOverheadSeconds',
    kind: 'number',
    min: 0,
    help: 'fixed cost of one step (simulated s)',
  },
  {
    flag: 'prefill-tokens-per-second',
    env: 'SIM_PREFILL_TOKENS_PER_SECOND',
    key: 'prefillTokensPerSecond',
    kind: 'number',
    min: 0,
    exclusiveMin: true,
    help: "uncached prefill rate ('inf' for free)",
  },
  {
    flag: 'prefill-context-cost',
    env: 'SIM_PREFILL_CONTEXT_COST',
    key: 'prefillContextCost',
    kind: 'number',
    min: 0,
    help: 'seconds added per prefill token per token of context before it (attention)',
  },
  {
    flag: 'decode-seconds-per-sequence',
    env: 'SIM_DECODE_SECONDS_PER_SEQUENCE',
    key: 'decodeSecondsPerSequence',
    kind: 'number',
    min: 0,
    help: 'step cost per decoding sequence (simulated s)',
  },
  {
    flag: 'output-len-min',
    env: 'SIM_OUTPUT_LEN_MIN',
    key: 'outputLenMin',
    kind: 'int',
    min: 1,
    help: 'shortest natural answer, tokens',
  },
  {
    flag: 'output-len-max',
    env: 'SIM_OUTPUT_LEN_MAX',
    key: 'outputLenMax',
    kind: 'int',
    min: 1,
    help: 'longest natural answer, tokens',
  },
  {
    flag: 'legacy-kv-metric',
    env: 'SIM_LEGACY_KV_METRIC',
    key: 'legacyKvMetric',
    kind: 'bool',
    help: 'name KV usage vllm:gpu_cache_usage_perc (vLLM < 0.10)',
  },
  {
    flag: 'startup-delay-seconds',
    env: 'SIM_STARTUP_DELAY_SECONDS',
    key: 'startupDelaySeconds',
    kind: 'number',
    min: 0,
    help: 'wall-clock seconds of /health 503 after start',
  },
  {
    // vLLM's own name (vllm/engine/arg_utils.py `long_prefill_token_threshold`), default 0.
    // vllm/config/scheduler.py sets it by itself only when max_num_partial_prefills > 1
    // ("if self.long_prefill_token_threshold == 0: self.long_prefill_token_threshold =
    // int(max_model_len * 0.04)"), which V1 refuses at start-up, so 0 stays 0 here.
    flag: 'long-prefill-token-threshold',
    env: 'VLLM_LONG_PREFILL_TOKEN_THRESHOLD',
    key: 'longPrefillTokenThreshold',
    kind: 'int',
    min: 0,
    help: 'most prompt tokens one request prefills per step (0 = no cap)',
  },
  {
    flag: 'first-chunk-admission',
    env: 'SIM_FIRST_CHUNK_ADMISSION',
    key: 'firstChunkAdmission',
    kind: 'bool',
    help: 'admit a request when its first chunk fits, as vLLM V1 did before scheduler_reserve_full_isl (PR #37307, 2026-03)',
  },
  {
    flag: 'enable-prefix-caching',
    env: 'SIM_ENABLE_PREFIX_CACHING',
    key: 'enablePrefixCaching',
    kind: 'bool',
    help: 'prefix caching (vLLM V1 default on)',
  },
  {
    flag: 'no-enable-prefix-caching',
    env: 'SIM_NO_ENABLE_PREFIX_CACHING',
    key: 'enablePrefixCaching',
    kind: 'negbool',
    help: 'turn prefix caching off',
  },
  {
    flag: 'scheduling-policy',
    env: 'SIM_SCHEDULING_POLICY',
    key: 'schedulingPolicy',
    kind: 'policy',
    help: 'fcfs or priority (request field `priority`, lower first)',
  },
  {
    flag: 'metrics-per-step',
    env: 'SIM_METRICS_PER_STEP',
    key: 'metricsPerStep',
    kind: 'bool',
    help: "publish running, waiting and KV usage as vLLM v1 does, from each step's end: after every request is aborted at once no step runs and they stay as they were (vllm#22545)",
  },
  {
    // vLLM's own flag and variable (vllm/entrypoints/openai/cli_args.py `--api-key`).
    flag: 'api-key',
    env: 'VLLM_API_KEY',
    key: 'apiKey',
    kind: 'secret',
    help: '/v1/* requests need Authorization: Bearer <key> (else 401), as vLLM --api-key',
  },
  {
    flag: 'lora-resolver-adapters',
    env: 'SIM_LORA_RESOLVER_ADAPTERS',
    key: 'loraResolverAdapters',
    kind: 'string',
    help: 'comma-separated LoRA adapter names a resolver plugin finds: loaded (and listed) at the first request naming one, as vLLM with VLLM_ALLOW_RUNTIME_LORA_UPDATING',
  },
];

const serverDefaults = {
  host: '127.0.0.1',
  port: 8000,
  timeScale: 1,
  legacyKvMetric: false,
  startupDelaySeconds: 0,
  longPrefillTokenThreshold: 0,
  firstChunkAdmission: false,
  enablePrefixCaching: true,
  schedulingPolicy: 'fcfs' as 'fcfs' | 'priority',
  metricsPerStep: false,
};

function convert(spec: OptionSpec, raw: string, source: string): unknown {
  const bad = (allowed: string) =>
    new SimConfigError(`${source}=${JSON.stringify(raw)} is invalid: expected ${allowed}`);
  switch (spec.kind) {
    case 'string':
      if (raw.trim() === '') throw bad('a non-empty string');
      return raw;
    case 'secret':
      if (!/^[\x21-\x7e]+$/.test(raw))
        throw new SimConfigError(
          `${source}=(hidden, ${raw.length} characters) is invalid: expected visible ASCII characters (no blanks)`,
        );
      return raw;
    case 'profile':
      if (!(profileNames as string[]).includes(raw)) throw bad(`one of ${profileNames.join(', ')}`);
      return raw;
    case 'policy':
      if (raw !== 'fcfs' && raw !== 'priority') throw bad('fcfs or priority');
      return raw;
    case 'negbool':
      return !(convert({ ...spec, kind: 'bool' }, raw, source) as boolean);
    case 'bool':
      if (['1', 'true', 'yes', 'on', ''].includes(raw)) return true;
      if (['0', 'false', 'no', 'off'].includes(raw)) return false;
      throw bad('true or false');
    case 'int':
    case 'number': {
      const value = /^[+]?inf(inity)?$/i.test(raw) ? Number.POSITIVE_INFINITY : Number(raw);
      const min = spec.min ?? Number.NEGATIVE_INFINITY;
      const allowed =
        (spec.kind === 'int' ? 'an integer' : 'a number') +
        (spec.min === undefined ? '' : spec.exclusiveMin ? ` > ${min}` : ` >= ${min}`);
      if (raw.trim() === '' || Number.isNaN(value)) throw bad(allowed);
      if (spec.kind === 'int' && !Number.isInteger(value)) throw bad(allowed);
      if (spec.exclusiveMin ? value <= min : value < min) throw bad(allowed);
      return value;
    }
  }
}

/** Parses `--flag value`, `--flag=value` and bare boolean flags. */
function readFlags(argv: readonly string[]): Map<string, string> {
  const flags = new Map<string, string>();
  for (let i = 0; i < argv.length; i += 1) {
    const arg = argv[i]!;
    if (!arg.startsWith('--'))
      throw new SimConfigError(`unexpected argument ${JSON.stringify(arg)}`);
    const eq = arg.indexOf('=');
    const name = eq === -1 ? arg.slice(2) : arg.slice(2, eq);
    const spec = specs.find((s) => s.flag === name);
    if (!spec) throw new SimConfigError(`unknown flag --${name} (see --help)`);
    if (eq !== -1) flags.set(name, arg.slice(eq + 1));
    else if (
      (spec.kind === 'bool' || spec.kind === 'negbool') &&
      (argv[i + 1] === undefined || argv[i + 1]!.startsWith('--'))
    )
      flags.set(name, 'true');
    else {
      const value = argv[i + 1];
      if (value === undefined) throw new SimConfigError(`--${name} needs a value`);
      flags.set(name, value);
      i += 1;
    }
  }
  return flags;
}

export function parseSimOptions(
  argv: readonly string[],
  env: Readonly<Record<string, string | undefined>> = process.env,
): SimOptions {
  const flags = readFlags(argv);
  const pick = (spec: OptionSpec): [string, string] | undefined => {
    const flag = flags.get(spec.flag);
    if (flag !== undefined) return [flag, `--${spec.flag}`];
    const fromEnv = env[spec.env];
    if (fromEnv !== undefined && fromEnv !== '') return [fromEnv, spec.env];
    return undefined;
  };
  const profileSpec = specs[0]!;
  const chosen = pick(profileSpec);
  const profile = (chosen ? convert(profileSpec, ...chosen) : 'homelab') as ProfileName;
  const options: SimOptions = { ...profiles[profile], ...serverDefaults, profile };
  for (const spec of specs.slice(1)) {
    const raw = pick(spec);
    if (raw) (options as unknown as Record<string, unknown>)[spec.key] = convert(spec, ...raw);
  }
  if (options.outputLenMin > options.outputLenMax)
    throw new SimConfigError(
      `output-len-min ${options.outputLenMin} is above output-len-max ${options.outputLenMax}`,
    );
  const kvTokens = options.numGpuBlocks * options.blockSize;
  if (options.maxModelLen > kvTokens)
    // vLLM refuses to start in this case too: one full-length sequence must fit the cache.
    throw new SimConfigError(
      `max-model-len ${options.maxModelLen} exceeds the KV cache (${options.numGpuBlocks} blocks x ${options.blockSize} = ${kvTokens} tokens)`,
    );
  return options;
}

export function simHelp(): string {
  const base = profiles.homelab as EngineProfile;
  const defaults: Record<string, unknown> = { ...base, ...serverDefaults, profile: 'homelab' };
  const lines = specs.map((s) => {
    const bare = s.kind === 'bool' || s.kind === 'negbool';
    const left = `  --${s.flag}${bare ? '' : ' <value>'}`;
    return `${left.padEnd(40)} ${s.help} [${s.env}; default ${String(defaults[s.key] ?? 'unset')}]`;
  });
  return [
    'Usage: sluice engine-sim [flags]',
    '',
    'A vLLM-compatible engine simulator. Profile values are defaults; flags override env.',
    'Defaults shown are the homelab profile; other profiles change the engine numbers.',
    '',
    ...lines,
    '  --help                                   print this help',
  ].join('\n');
}
