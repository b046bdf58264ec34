// Model name → where its requests go. Built once at start-up; the gateway asks per request,
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
  config.pools.forEach((pool, p) => {
    const route: Route = { kind: 'pool', pool };
    pool.models.forEach((model, m) => add(model, route, `pools[${p}].models[${m}]`));
  });
  config.passthrough.forEach(({ model, url, apiKey }, i) =>
    add(
      model,
      { kind: 'passthrough', url, ...(apiKey === undefined ? {} : { apiKey }) },
      `passthrough[${i}].model`,
    ),
  );
  return { route: (model) => routes.get(model) };
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
 * A copy of `config` in which pool `poolName` serves `models` — for the app that discovered
 * the `VLLM_URL` engine's model from `/v1/models`. Names are validated like those in the file
 * and must not be routed elsewhere. The input is not modified.
 */
export function withDiscoveredModels(
  config: SluiceConfig,
  poolName: string,
  models: readonly string[],
): SluiceConfig {
  const index = config.pools.findIndex((pool) => pool.name === poolName);
  if (index === -1)
    throw new ConfigError(
      'pools',
      `pool ${show(poolName)} does not exist: expected one of ${config.pools.map((p) => p.name).join(', ') || '(no pools)'}`,
    );
  models.forEach((model, m) => {
    if (shared.modelName.fromText(model) === undefined)
      throw new ConfigError(
        `pools[${index}].models[${m}]`,
        `discovered model ${show(model)} for pool ${poolName} is invalid: expected ${shared.modelName.allowed}`,
      );
  });
  const pools = config.pools.map((pool, p) =>
    p === index ? { ...pool, models: [...models] } : pool,
  );
  const next = { ...config, pools };
  createRouter(next); // a discovered name may collide with another pool or a pass-through model
  return next;
}
