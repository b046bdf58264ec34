// Model name → where its requests go. Built at start-up and again only when the engines'
// model lists change (discovery, adapters loaded at runtime); the gateway asks per request,
// so a lookup is one Map.get and allocates nothing.
import { ConfigError, show } from './errors.js';
import { shared } from './variables.js';
import type { PassthroughConfig, PoolConfig, SluiceConfig } from './types.js';

export type Route =
  | { readonly kind: 'pool'; readonly pool: PoolConfig }
  | {
      readonly kind: 'passthrough';
      readonly url: string;
      /** The backend's own bearer token (the client's is never forwarded when this is set). */
      readonly apiKey?: string;
    };

export interface Router {
  /** Exact, case-sensitive match on the model name (vLLM's served model names are). */
  route(model: string): Route | undefined;
  /**
   * Where a request that names no model goes: vLLM's `model` is optional and an engine serves
   * a request without one (or with null or "") with its first served model
   * (`_is_model_supported`, vllm/entrypoints/openai/engine/serving.py). That is one answer only
   * when one destination exists: the pool, when the config has exactly one pool and no
   * pass-through backend. Undefined otherwise: which of several models was meant is the
   * client's to say.
   */
  readonly unnamed: Route | undefined;
  /**
   * Where a named model that `route` does not know goes: the pool whose engines load LoRA
   * adapters on first use (`loraResolver`). vLLM asks its resolvers for a name it does not
   * serve, with VLLM_ALLOW_RUNTIME_LORA_UPDATING, and answers 404 when none finds it
   * (`_check_model` in vllm/entrypoints/openai/engine/serving.py, `resolve_lora` in
   * vllm/entrypoints/openai/models/serving.py); once loaded, the adapter is listed and routed
   * by name (the gateway's discovery.ts). Undefined without such a pool: Sluice answers 404.
   */
  readonly resolver: Route | undefined;
}

/**
 * Builds the routing table. Call it once, after any model discovery (see
 * `withDiscoveredModels`), and keep the result; do not call it per request. Throws
 * `ConfigError` if a hand-built config routes one model twice (`loadConfig` never does).
 */
export function createRouter(config: SluiceConfig): Router {
  const routes = new Map<string, Route>();
  const placed = new Map<string, string>();
  const add = (model: string, route: Route, where: string) => {
    const previous = placed.get(model);
    if (previous !== undefined)
      throw new ConfigError(
        where,
        `${where}=${show(model)} is invalid: expected a model not routed elsewhere (already at ${previous})`,
      );
    routes.set(model, route);
    placed.set(model, where);
  };
  const poolRoutes = config.pools.map((pool, p) => {
    const route: Route = { kind: 'pool', pool };
    pool.models.forEach((model, m) => add(model, route, `pools[${p}].models[${m}]`));
    return route;
  });
  config.passthrough.forEach(({ model, url, apiKey }, i) =>
    add(
      model,
      { kind: 'passthrough', url, ...(apiKey === undefined ? {} : { apiKey }) },
      `passthrough[${i}].model`,
    ),
  );
  // Known before the pool's model names are (discovery): the pool is the same either way.
  const unnamed =
    poolRoutes.length === 1 && config.passthrough.length === 0 ? poolRoutes[0] : undefined;
  const resolver = poolRoutes.find((route) => route.pool.loraResolver === true);
  return { route: (model) => routes.get(model), unnamed, resolver };
}

interface Lookup {
  pools: Map<string, PoolConfig>;
  passthrough: Map<string, PassthroughConfig>;
}

// Keyed by the config object: treat a loaded config as immutable, or the cache goes stale.
const lookups = new WeakMap<SluiceConfig, Lookup>();

function lookup(config: SluiceConfig): Lookup {
  let found = lookups.get(config);
  if (!found) {
    createRouter(config); // same duplicate check
    found = {
      pools: new Map(config.pools.flatMap((pool) => pool.models.map((m) => [m, pool] as const))),
      passthrough: new Map(config.passthrough.map((entry) => [entry.model, entry] as const)),
    };
    lookups.set(config, found);
  }
  return found;
}

/** The pool serving `model`, if any. Builds a Map on the first call per config object. */
export function poolForModel(config: SluiceConfig, model: string): PoolConfig | undefined {
  return lookup(config).pools.get(model);
}

/** The pass-through backend serving `model`, if any. Builds a Map on the first call per config. */
export function passthroughForModel(
  config: SluiceConfig,
  model: string,
): PassthroughConfig | undefined {
  return lookup(config).passthrough.get(model);
}

/**
 * A copy of `config` in which pool `poolName` serves `models` — for the app that learns a
 * pool's model names from its engines' `/v1/models` (a `VLLM_URL` engine's model, the LoRA
 * adapters an engine loads). Names are validated like those in the file and must not be
 * routed elsewhere (by another pool or a pass-through backend); a name listed twice counts
 * once. Without `refused`, a name that fails throws `ConfigError`; with it, the name is left
 * out and reported there, and the rest is served: an engine that loads an adapter whose name
 * another pool serves must not take that pool's model, nor stop the others being routed.
 * The input is not modified.
 */
export function withDiscoveredModels(
  config: SluiceConfig,
  poolName: string,
  models: readonly string[],
  refused?: (model: string, reason: string) => void,
): SluiceConfig {
  const index = config.pools.findIndex((pool) => pool.name === poolName);
  if (index === -1)
    throw new ConfigError(
      'pools',
      `pool ${show(poolName)} does not exist: expected one of ${config.pools.map((p) => p.name).join(', ') || '(no pools)'}`,
    );
  const withModels = (list: readonly string[]) => {
    const pools = config.pools.map((pool, p) =>
      p === index ? { ...pool, models: [...list] } : pool,
    );
    return { ...config, pools };
  };
  const kept: string[] = [];
  // The routes of everything but this pool: a name found there is served elsewhere.
  const elsewhere = refused === undefined ? undefined : createRouter(withModels([]));
  models.forEach((model, m) => {
    if (kept.includes(model)) return;
    if (shared.modelName.fromText(model) === undefined) {
      const allowed = `expected ${shared.modelName.allowed}`;
      if (refused === undefined)
        throw new ConfigError(
          `pools[${index}].models[${m}]`,
          `discovered model ${show(model)} for pool ${poolName} is invalid: ${allowed}`,
        );
      refused(model, allowed);
      return;
    }
    const other = elsewhere?.route(model);
    if (other !== undefined) {
      refused!(
        model,
        other.kind === 'pool'
          ? `served by pool ${other.pool.name}`
          : `a pass-through model (${other.url})`,
      );
      return;
    }
    kept.push(model);
  });
  const next = withModels(kept);
  createRouter(next); // a discovered name may collide with another pool or a pass-through model
  return next;
}
