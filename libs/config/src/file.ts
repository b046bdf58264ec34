// The optional YAML file (SLUICE_CONFIG): pools, engines, pass-through models, degradation
// (its blocks are read in degradation.ts) and tenants (tenants.ts). Validated strictly: an unknown key is an error,
// because a typo in a file is a bug, not a choice.
import { parseDocument } from 'yaml';
import {
  checkDegradation,
  copyDegradation,
  readDegradation,
  type ResolvedDegradation,
} from './degradation.js';
import { ConfigError, hidden, show } from './errors.js';
import { engineNameFromUrl, maskCredentials, matching, oneOf, type Rule } from './rules.js';
import { readTenants } from './tenants.js';
import type {
  DegradationConfig,
  EngineConfig,
  GpuSource,
  LongPromptConfig,
  PassthroughConfig,
  MaxInflightSource,
  PoolConfig,
  TenantConfig,
} from './types.js';
import { shared } from './variables.js';

/** Values a pool or engine takes when the file does not say. */
export interface FileDefaults {
  maxInflight: number;
  /** Where `maxInflight` came from (the environment, or the built-in default). */
  maxInflightSource: Exclude<MaxInflightSource, 'config'>;
  queueDepth: number;
  maxParkSeconds: number;
  apiKey: string | undefined;
  /** Built-in degradation settings for this environment, under the file's own. */
  degradation: DegradationConfig;
  /** `GPU_SOURCE`: `gpu` is a valid degradation signal only when it is not `none`. */
  gpuSource: GpuSource;
  /** The ADMISSION_LONG_* variables; a pool's `longPrompts` block overrides them key by key. */
  longPrompts: LongPromptConfig;
  /** SLUICE_MAX_PRIORITY: no tenant's `maxPriority` may exceed it. */
  maxPriority: number;
}

export interface FileContents {
  pools: PoolConfig[];
  passthrough: PassthroughConfig[];
  /** Absent when the file has no `tenants` key. */
  tenants?: TenantConfig[];
}

const TOP_KEYS = ['pools', 'passthrough', 'degradation', 'tenants'] as const;
const POOL_KEYS = [
  'name',
  'models',
  'maxInflight',
  'queueDepth',
  'maxParkSeconds',
  'engines',
  'degradation',
  'longPrompts',
  'loraResolver',
] as const;
const ENGINE_KEYS = ['url', 'name', 'maxInflight', 'apiKey', 'lane'] as const;
const LONG_PROMPT_KEYS = [
  'thresholdTokens',
  'maxShare',
  'maxInPrefill',
  'agingSeconds',
  'kvFit',
] as const;
const lanes = oneOf(['any', 'long', 'short'] as const);
const bool: Rule<boolean> = {
  allowed: 'true or false',
  fromText: (raw) => (raw === 'true' ? true : raw === 'false' ? false : undefined),
  fromValue: (raw) => (typeof raw === 'boolean' ? raw : undefined),
};
const PASSTHROUGH_KEYS = ['model', 'url', 'apiKey'] as const;

const poolName = matching(/^[a-z0-9-]{1,63}$/, "1 to 63 lower-case letters, digits or '-'");
const engineName = matching(
  /^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$/,
  "1 to 128 letters, digits, '.', '_', ':' or '-', starting with a letter or digit",
);

type Mapping = Record<string, unknown>;

const isMapping = (value: unknown): value is Mapping =>
  typeof value === 'object' && value !== null && !Array.isArray(value);

/**
 * Keys of the file whose values are secrets: an engine's or a pass-through's `apiKey`, a
 * tenant's `apiKeys`. Whatever was written at one of them (a string, a number, a list, a
 * mapping), it was meant as a secret, so no message shows it, nor any such key inside a value
 * that is shown. The one place that decides.
 */
const SECRET_KEYS: ReadonlySet<string> = new Set(['apiKey', 'apiKeys']);

/** The key a path ends in: `apiKeys` for `tenants[0].apiKeys[2]`. */
const lastKey = (path: string) => /(?:^|\.)([^.[\]]+)(?:\[\d+\])*$/.exec(path)?.[1] ?? '';

/**
 * What a message may show of the value under `key`: a secret hidden (SECRET_KEYS), and a
 * `url` (refused when it carries credentials, but shown in the message) with them masked.
 */
function concealed(key: string, value: unknown): unknown {
  if (SECRET_KEYS.has(key)) return hidden(value);
  if (key === 'url' && typeof value === 'string') return maskCredentials(value);
  return value;
}

/** A value of the file as a message shows it, at `path` and anywhere inside it. */
function showAt(path: string, value: unknown): string {
  const key = lastKey(path);
  if (SECRET_KEYS.has(key)) return hidden(value);
  return show(concealed(key, value), concealed);
}

/** Reads one file; every error names the file and the path inside it. */
export class FileChecker {
  constructor(readonly file: string) {}

  error(path: string, detail: string): ConfigError {
    return new ConfigError(path, `${this.file}: ${path} ${detail}`);
  }

  /** `<file>: <path>=<value> is invalid: expected <allowed>`; secrets are never shown. */
  invalid(path: string, value: unknown, allowed: string): ConfigError {
    return new ConfigError(
      path,
      `${this.file}: ${path}=${showAt(path, value)} is invalid: expected ${allowed}`,
    );
  }

  mapping(value: unknown, path: string, keys: readonly string[]): Mapping {
    if (!isMapping(value))
      throw this.invalid(path || '(document)', value, `a mapping with keys ${keys.join(', ')}`);
    for (const key of Object.keys(value))
      if (!keys.includes(key))
        throw this.error(join(path, key), `is not a known key: expected one of ${keys.join(', ')}`);
    return value;
  }

  list(value: unknown, path: string, what: string, nonEmpty: boolean): unknown[] {
    const allowed = `a ${nonEmpty ? 'non-empty ' : ''}list of ${what}`;
    if (value === undefined || value === null)
      throw this.error(path, `is missing: expected ${allowed}`);
    if (!Array.isArray(value) || (nonEmpty && value.length === 0))
      throw this.invalid(path, value, allowed);
    return value;
  }

  optional<T>(owner: Mapping, key: string, path: string, rule: Rule<T>): T | undefined {
    if (!Object.hasOwn(owner, key)) return undefined;
    const raw = owner[key];
    const value = rule.fromValue(raw);
    if (value === undefined) throw this.invalid(join(path, key), raw, rule.allowed);
    return value;
  }

  required<T>(owner: Mapping, key: string, path: string, rule: Rule<T>): T {
    if (!Object.hasOwn(owner, key) || owner[key] === null)
      throw this.error(join(path, key), `is missing: expected ${rule.allowed}`);
    return this.optional(owner, key, path, rule) as T;
  }
}

const join = (path: string, key: string) => (path === '' ? key : `${path}.${key}`);

/** Turns the text of a YAML document into plain data, or throws one line naming the file. */
function parseYaml(file: string, text: string): unknown {
  // prettyErrors puts "at line L, column C:" at the end of the first line, then a code frame.
  const doc = parseDocument(text, { prettyErrors: true, uniqueKeys: true });
  const problem = doc.errors[0] ?? doc.warnings[0];
  if (problem) {
    const detail = (problem.message.split('\n')[0] ?? '').replace(/:\s*$/, '');
    throw new ConfigError('SLUICE_CONFIG', `${file}: not valid YAML: ${detail}`);
  }
  try {
    return doc.toJS({ maxAliasCount: 100 });
  } catch (error) {
    const detail = (error instanceof Error ? error.message : String(error)).split('\n')[0];
    throw new ConfigError('SLUICE_CONFIG', `${file}: not valid YAML: ${detail}`);
  }
}

function readLongPrompts(
  check: FileChecker,
  pool: Mapping,
  path: string,
  defaults: LongPromptConfig,
): LongPromptConfig {
  if (!Object.hasOwn(pool, 'longPrompts')) return { ...defaults };
  const at = join(path, 'longPrompts');
  const block = check.mapping(pool['longPrompts'], at, LONG_PROMPT_KEYS);
  return {
    thresholdTokens:
      check.optional(block, 'thresholdTokens', at, shared.longPromptTokens) ??
      defaults.thresholdTokens,
    maxShare: check.optional(block, 'maxShare', at, shared.longMaxShare) ?? defaults.maxShare,
    maxInPrefill:
      check.optional(block, 'maxInPrefill', at, shared.longMaxInPrefill) ?? defaults.maxInPrefill,
    agingSeconds:
      check.optional(block, 'agingSeconds', at, shared.longAgingSeconds) ?? defaults.agingSeconds,
    kvFit: check.optional(block, 'kvFit', at, bool) ?? defaults.kvFit,
  };
}

/**
 * Validates the file's text. `file` is only used in messages. Models must be unique across
 * pools and pass-through entries; engine URLs and names unique across pools (one engine in
 * two pools would be released by two dispatchers, each with its own cap).
 */
export function readPoolFile(file: string, text: string, defaults: FileDefaults): FileContents {
  const check = new FileChecker(file);
  const root = check.mapping(parseYaml(file, text), '', TOP_KEYS);
  // The top-level block first: its errors come before any pool's, and pools inherit it.
  const fileDegradation = readDegradation(check, root, '', {
    config: defaults.degradation,
    origin: {},
  });
  checkDegradation(check, fileDegradation, defaults.gpuSource);

  const modelAt = new Map<string, string>();
  const claimModel = (model: string, path: string) => {
    const previous = modelAt.get(model);
    if (previous !== undefined)
      throw check.invalid(path, model, `a model not routed elsewhere (already at ${previous})`);
    modelAt.set(model, path);
  };
  const poolAt = new Map<string, string>();
  const urlAt = new Map<string, string>();
  /** The pool whose engines resolve unknown names (`loraResolver`): one at most. */
  let resolverAt: string | undefined;
  const engineAt = new Map<string, string>();

  const pools: PoolConfig[] = [];
  const rawPools = Object.hasOwn(root, 'pools')
    ? check.list(root['pools'], 'pools', 'pools', false)
    : [];
  rawPools.forEach((rawPool, p) => {
    const path = `pools[${p}]`;
    const pool = check.mapping(rawPool, path, POOL_KEYS);
    const name = check.required(pool, 'name', path, poolName);
    const previousPool = poolAt.get(name);
    if (previousPool !== undefined)
      throw check.invalid(
        `${path}.name`,
        name,
        `a name not used by another pool (${previousPool})`,
      );
    poolAt.set(name, path);

    const models = check
      .list(pool['models'], `${path}.models`, 'model names', true)
      .map((raw, m) => {
        const modelPath = `${path}.models[${m}]`;
        const model = shared.modelName.fromValue(raw);
        if (model === undefined) throw check.invalid(modelPath, raw, shared.modelName.allowed);
        claimModel(model, modelPath);
        return model;
      });

    const poolCap = check.optional(pool, 'maxInflight', path, shared.maxInflight);
    const queueDepth = check.optional(pool, 'queueDepth', path, shared.queueDepth);
    const maxParkSeconds = check.optional(pool, 'maxParkSeconds', path, shared.maxParkSeconds);
    const degradation: ResolvedDegradation = readDegradation(check, pool, path, fileDegradation);
    if (degradation !== fileDegradation) checkDegradation(check, degradation, defaults.gpuSource);

    const engines = check
      .list(pool['engines'], `${path}.engines`, 'engines', true)
      .map((rawEngine, e): EngineConfig => {
        const enginePath = `${path}.engines[${e}]`;
        const engine = check.mapping(rawEngine, enginePath, ENGINE_KEYS);
        const url = check.required(engine, 'url', enginePath, shared.engineUrl);
        const previousUrl = urlAt.get(url);
        if (previousUrl !== undefined)
          throw check.invalid(
            `${enginePath}.url`,
            url,
            `an engine not listed elsewhere (already at ${previousUrl}; two pools would each apply their own cap)`,
          );
        urlAt.set(url, enginePath);

        const given = check.optional(engine, 'name', enginePath, engineName);
        const name = given ?? engineNameFromUrl(url);
        const previousName = engineAt.get(name);
        if (previousName !== undefined)
          throw check.invalid(
            `${enginePath}.name`,
            name,
            `a name not used by another engine (${previousName})${given === undefined ? '; the name comes from the URL, so set name' : ''}`,
          );
        engineAt.set(name, enginePath);

        const cap =
          check.optional(engine, 'maxInflight', enginePath, shared.maxInflight) ?? poolCap;
        const apiKey =
          check.optional(engine, 'apiKey', enginePath, shared.apiKey) ?? defaults.apiKey;
        const lane = check.optional(engine, 'lane', enginePath, lanes) ?? 'any';
        return {
          name,
          url,
          maxInflight: cap ?? defaults.maxInflight,
          capSource: cap === undefined ? defaults.maxInflightSource : 'config',
          ...(apiKey === undefined ? {} : { apiKey }),
          lane,
        };
      });
    // Every prompt must have somewhere to go: a pool of only `long` lanes would park every
    // short request until its park limit, and one of only `short` lanes every long one.
    for (const wanted of ['short', 'long'] as const)
      if (engines.every((e) => e.lane !== 'any' && e.lane !== wanted))
        throw check.invalid(
          `${path}.engines`,
          engines.map((e) => e.lane),
          `at least one engine with lane any or ${wanted} (${wanted} prompts would have nowhere to go)`,
        );
    const longPrompts = readLongPrompts(check, pool, path, defaults.longPrompts);
    const loraResolver = check.optional(pool, 'loraResolver', path, bool) === true;
    if (loraResolver && resolverAt !== undefined)
      throw check.invalid(
        `${path}.loraResolver`,
        true,
        `true in one pool at most (already at ${resolverAt}: a name routed nowhere else can go to one pool only)`,
      );
    if (loraResolver) resolverAt = `${path}.loraResolver`;

    pools.push({
      name,
      models,
      engines,
      queueDepth: queueDepth ?? defaults.queueDepth,
      maxParkSeconds: maxParkSeconds ?? defaults.maxParkSeconds,
      degradation: copyDegradation(degradation.config),
      longPrompts,
      ...(loraResolver ? { loraResolver: true as const } : {}),
    });
  });

  const rawPassthrough = Object.hasOwn(root, 'passthrough')
    ? check.list(root['passthrough'], 'passthrough', 'pass-through backends', false)
    : [];
  const passthrough = rawPassthrough.map((raw, i): PassthroughConfig => {
    const path = `passthrough[${i}]`;
    const entry = check.mapping(raw, path, PASSTHROUGH_KEYS);
    const model = check.required(entry, 'model', path, shared.modelName);
    claimModel(model, `${path}.model`);
    const url = check.required(entry, 'url', path, shared.engineUrl);
    // vLLM answers every name it serves (--served-model-name a b, LoRA adapters) on the same
    // origin: a pass-through to a pool's engine would reach it outside its cap.
    const engineAt = urlAt.get(url);
    if (engineAt !== undefined)
      throw check.invalid(
        `${path}.url`,
        url,
        `a backend that is not a pool's engine (it is ${engineAt}: its requests would bypass that engine's cap; list the model in that pool's models instead)`,
      );
    const apiKey = check.optional(entry, 'apiKey', path, shared.apiKey);
    return { model, url, ...(apiKey === undefined ? {} : { apiKey }) };
  });

  // After the pools: a tenant's queue bound is checked against their depths.
  const tenants = readTenants(check, root, defaults.maxPriority, pools);
  return { pools, passthrough, ...(tenants === undefined ? {} : { tenants }) };
}
