// Degradation (DESIGN, Policy: degradation): the defaults, and the `degradation:` blocks of
// the YAML file (top level: defaults for every pool; per pool: overrides). Any field may be
// given on either level; `profiles` replaces the whole list. Validated as strictly as the
// rest of the file: unknown keys, bad values and impossible combinations are errors.
import type { FileChecker } from './file.js';
import { decimal, integer, matching, oneOf, type Rule } from './rules.js';
import type {
  DegradationConfig,
  DegradationProfile,
  DegradationSignal,
  GpuSource,
  SystemPromptMode,
} from './types.js';

export const DEGRADATION_SIGNALS = ['kv', 'gpu', 'queue'] as const;
export const SYSTEM_PROMPT_MODES = ['prepend', 'append'] as const;

const deepFreeze = <T>(value: T): T => {
  if (typeof value === 'object' && value !== null) {
    for (const inner of Object.values(value)) deepFreeze(inner);
    Object.freeze(value);
  }
  return value;
};

/**
 * The shipped defaults: the reference article's three states. `signal` is `['kv']` here;
 * `loadConfig` adds `'gpu'` when `GPU_SOURCE` is not `none`. Frozen: copy before changing.
 * `examples/degradation.yaml` spells the same values out (a test keeps them equal).
 */
export const defaultDegradation: DegradationConfig = deepFreeze({
  enabled: true,
  // Never the GPU by default, with a GPU source or not: its utilization is the share of time
  // any kernel ran (NVML's nvmlUtilization_t.gpu, nvidia-smi's utilization.gpu and
  // DCGM_FI_DEV_GPU_UTIL alike), near 100 % while vLLM decodes a single sequence, so it would
  // put a pool in its last state under trivial load. A pool that wants it names it.
  signal: ['kv'],
  alpha: 0.3,
  hysteresis: 0.05,
  minMaxTokens: 16,
  defaultMaxTokens: 1024,
  systemPrompt: 'prepend',
  completionPrefix: true,
  allowOptOut: false,
  profiles: [
    { name: 'normal', threshold: 0, maxTokensFactor: 1 },
    { name: 'tired', threshold: 0.75, instruction: 'Answer concisely.', maxTokensFactor: 0.7 },
    {
      name: 'lazy',
      threshold: 0.9,
      instruction: 'Provide extremely short answers only. No explanations. Code only if asked.',
      maxTokensFactor: 0.3,
    },
  ],
});

/** A deep copy that shares nothing with `config`. */
export function copyDegradation(config: DegradationConfig): DegradationConfig {
  return {
    ...config,
    signal: [...config.signal],
    profiles: config.profiles.map((profile) => ({ ...profile })),
  };
}

/** A resolved block and where its relation-bearing fields were written (absent = built in). */
export interface ResolvedDegradation {
  config: DegradationConfig;
  origin: { signal?: string; hysteresis?: string; profiles?: string };
}

const KEYS = [
  'enabled',
  'signal',
  'alpha',
  'hysteresis',
  'minMaxTokens',
  'defaultMaxTokens',
  'systemPrompt',
  'completionPrefix',
  'allowOptOut',
  'profiles',
] as const;
const PROFILE_KEYS = ['name', 'threshold', 'instruction', 'maxTokensFactor'] as const;

const flag: Rule<boolean> = {
  allowed: 'true or false',
  fromText: (raw) => (raw === 'true' ? true : raw === 'false' ? false : undefined),
  fromValue: (value) => (typeof value === 'boolean' ? value : undefined),
};

const rules = {
  enabled: flag,
  alpha: decimal({ min: 0, exclusiveMin: true, max: 1 }),
  hysteresis: decimal({ min: 0, max: 1 }),
  minMaxTokens: integer(1),
  defaultMaxTokens: integer(1),
  systemPrompt: oneOf<SystemPromptMode>(SYSTEM_PROMPT_MODES),
  completionPrefix: flag,
  allowOptOut: flag,
  signal: oneOf<DegradationSignal>(DEGRADATION_SIGNALS),
  profileName: matching(
    /^[a-z0-9][a-z0-9_-]{0,31}$/,
    "1 to 32 lower-case letters, digits, '_' or '-', starting with a letter or digit",
  ),
  threshold: decimal({ min: 0, max: 1 }),
  instruction: matching(
    /^(?=[^]*\S)(?:[^\p{Cc}]|[\t\n])+$/u,
    'a non-blank text without control characters other than tab and newline',
  ),
  maxTokensFactor: decimal({ min: 0, exclusiveMin: true, max: 1 }),
} as const;

function readSignal(check: FileChecker, raw: unknown, path: string): DegradationSignal[] {
  const allowed = `${rules.signal.allowed.replace(/^one of /, '')}`;
  const list = check.list(raw, path, `signal sources (${allowed})`, true);
  const seen = new Set<DegradationSignal>();
  return list.map((item, i) => {
    const source = rules.signal.fromValue(item);
    if (source === undefined) throw check.invalid(`${path}[${i}]`, item, rules.signal.allowed);
    if (seen.has(source)) throw check.invalid(`${path}[${i}]`, item, 'a source not listed twice');
    seen.add(source);
    return source;
  });
}

function readProfiles(check: FileChecker, raw: unknown, path: string): DegradationProfile[] {
  const nameAt = new Map<string, string>();
  let previous: number | undefined;
  return check.list(raw, path, 'profiles', true).map((rawProfile, i): DegradationProfile => {
    const at = `${path}[${i}]`;
    const profile = check.mapping(rawProfile, at, PROFILE_KEYS);
    const name = check.required(profile, 'name', at, rules.profileName);
    const other = nameAt.get(name);
    if (other !== undefined)
      throw check.invalid(`${at}.name`, name, `a name not used by another profile (${other})`);
    nameAt.set(name, at);

    const threshold = check.required(profile, 'threshold', at, rules.threshold);
    if (previous === undefined && threshold !== 0)
      throw check.invalid(
        `${at}.threshold`,
        threshold,
        '0: the first profile is the state under no load',
      );
    if (previous !== undefined && !(threshold > previous))
      throw check.invalid(
        `${at}.threshold`,
        threshold,
        `a number above the previous profile's threshold (${previous}) and at most 1`,
      );
    previous = threshold;

    const instruction = check.optional(profile, 'instruction', at, rules.instruction);
    const maxTokensFactor =
      check.optional(profile, 'maxTokensFactor', at, rules.maxTokensFactor) ?? 1;
    return {
      name,
      threshold,
      ...(instruction === undefined ? {} : { instruction }),
      maxTokensFactor,
    };
  });
}

/**
 * Reads `owner.degradation` (when present) over `base`. `path` is the owner's path: '' for
 * the top level, `pools[0]` for a pool. Relations between fields are checked separately,
 * on the result (`checkDegradation`), because they may span both levels.
 */
export function readDegradation(
  check: FileChecker,
  owner: Record<string, unknown>,
  path: string,
  base: ResolvedDegradation,
): ResolvedDegradation {
  if (!Object.hasOwn(owner, 'degradation')) return base;
  const at = path === '' ? 'degradation' : `${path}.degradation`;
  const block = check.mapping(owner['degradation'], at, KEYS);
  const config = copyDegradation(base.config);
  const origin = { ...base.origin };

  config.enabled = check.optional(block, 'enabled', at, rules.enabled) ?? config.enabled;
  if (Object.hasOwn(block, 'signal')) {
    config.signal = readSignal(check, block['signal'], `${at}.signal`);
    origin.signal = `${at}.signal`;
  }
  config.alpha = check.optional(block, 'alpha', at, rules.alpha) ?? config.alpha;
  const hysteresis = check.optional(block, 'hysteresis', at, rules.hysteresis);
  if (hysteresis !== undefined) {
    config.hysteresis = hysteresis;
    origin.hysteresis = `${at}.hysteresis`;
  }
  config.minMaxTokens =
    check.optional(block, 'minMaxTokens', at, rules.minMaxTokens) ?? config.minMaxTokens;
  config.defaultMaxTokens =
    check.optional(block, 'defaultMaxTokens', at, rules.defaultMaxTokens) ??
    config.defaultMaxTokens;
  config.systemPrompt =
    check.optional(block, 'systemPrompt', at, rules.systemPrompt) ?? config.systemPrompt;
  config.completionPrefix =
    check.optional(block, 'completionPrefix', at, rules.completionPrefix) ??
    config.completionPrefix;
  config.allowOptOut =
    check.optional(block, 'allowOptOut', at, rules.allowOptOut) ?? config.allowOptOut;
  if (Object.hasOwn(block, 'profiles')) {
    config.profiles = readProfiles(check, block['profiles'], `${at}.profiles`);
    origin.profiles = `${at}.profiles`;
  }
  return { config, origin };
}

/**
 * Relations on a resolved block, whichever level each field came from:
 * - the hysteresis is below the lowest threshold above 0, or that state could never be
 *   left (the smoothed signal never falls below 0);
 * - `gpu` is only a signal source when `GPU_SOURCE` reads a GPU.
 * The message names the field written in the file (the hysteresis when both are).
 */
export function checkDegradation(
  check: FileChecker,
  { config, origin }: ResolvedDegradation,
  gpuSource: GpuSource,
): void {
  const lowest = config.profiles[1];
  if (lowest !== undefined && !(config.hysteresis < lowest.threshold)) {
    const thresholdAt = origin.profiles ? `${origin.profiles}[1].threshold` : undefined;
    if (origin.hysteresis !== undefined || thresholdAt === undefined)
      throw check.invalid(
        origin.hysteresis ?? 'degradation.hysteresis',
        config.hysteresis,
        `a number below the lowest threshold above 0 (${lowest.threshold}${thresholdAt ? ` at ${thresholdAt}` : ', a default'}), or that state could never be left`,
      );
    throw check.invalid(
      thresholdAt,
      lowest.threshold,
      `a number above the hysteresis (${config.hysteresis}, a default), or this state could never be left`,
    );
  }
  if (gpuSource === 'none' && config.signal.includes('gpu'))
    throw check.invalid(
      origin.signal ?? 'degradation.signal',
      config.signal,
      'sources that are read: gpu needs GPU_SOURCE, which is none',
    );
}
