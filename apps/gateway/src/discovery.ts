// Fills in the model of a pool configured by VLLM_URL without VLLM_MODEL, from the
// engine's /v1/models. Runs after the gateway listens and retries until the engine answers
// (or the gateway closes): an engine that starts after the gateway is routine. Then keeps the
// routes in step with what the engines list (ModelFollower): LoRA adapters loaded at runtime.
import { setTimeout as sleep } from 'node:timers/promises';
import { withDiscoveredModels, type SluiceConfig } from '@sluice/config';
import { fetchModelCards, type ModelCards } from './model-cards.js';
import type { Routing } from './routing.js';

interface Log {
  info(o: object, m: string): void;
  warn(o: object, m: string): void;
}

const FIRST_RETRY_MS = 500;
const MAX_RETRY_MS = 5000;

/** Resolves with the config whose pools all have models; rejects only when `signal` aborts. */
export async function discoverModels(
  config: SluiceConfig,
  log: Pick<Log, 'warn'>,
  signal: AbortSignal,
): Promise<SluiceConfig> {
  let next = config;
  for (const pool of config.pools) {
    if (pool.models.length > 0) continue;
    const engine = pool.engines[0]!;
    for (let attempt = 0; ; attempt++) {
      try {
        const models = (await fetchModelCards(engine, signal)).map((card) => card.id);
        if (models.length === 0) throw new Error('GET /v1/models answered no model');
        next = withDiscoveredModels(next, pool.name, models);
        break;
      } catch (err) {
        signal.throwIfAborted();
        // Every attempt at first, then every tenth: an engine that stays away is one line a minute.
        if (attempt < 3 || attempt % 10 === 0)
          log.warn(
            { engine: engine.url, err: (err as Error).message, attempt },
            'engine not answering /v1/models yet (set VLLM_MODEL to skip discovery); retrying',
          );
        await sleep(Math.min(MAX_RETRY_MS, FIRST_RETRY_MS * 2 ** attempt), undefined, { signal });
      }
    }
  }
  return next;
}

/**
 * Keeps the routes in step with what the pools' engines list, each time the model cards are
 * read (MODEL_CARDS_REFRESH_MS): LoRA adapters loaded at runtime (`/v1/load_lora_adapter`
 * with VLLM_ALLOW_RUNTIME_LORA_UPDATING, or by a LoRA resolver plugin) appear in vLLM's
 * `/v1/models` with `parent` set to their base model, and vLLM serves them by that name.
 *
 * - A pool whose models were discovered (configured without names) serves every model its
 *   engines list now: it gains new ones, and loses one once a read shows it gone. Until that
 *   read the model stays routable (an adapter unloaded in between gets vLLM's own 404). A pool
 *   whose engines are all away, or list nothing, keeps its models.
 * - A pool whose models are configured serves those, plus every listed model whose `parent`
 *   is one of them (a LoRA runs on its base model's engines), likewise followed. Other models
 *   its engines list stay unrouted: the configuration named the ones to serve.
 *
 * A name that is invalid or that another pool or a pass-through backend serves is left out
 * (logged once): routes in place win, so an adapter loaded on the wrong engine never takes
 * another pool's model. The cards are read from the first engine of the pool that answers:
 * load an adapter on every engine of its pool, as the dispatcher may release to any of them.
 */
export class ModelFollower {
  private readonly reported = new Set<string>();

  constructor(
    /** The configuration as loaded: which pools name their models, and which. */
    private readonly configured: SluiceConfig,
    private readonly log: Log,
  ) {}

  /**
   * Reads the engines' cards again and routes by what they list now: the gateway's periodic
   * read. Resolves with the configuration `routing` was updated to, undefined when the routes
   * stay as they are (or `signal` aborted); never rejects.
   */
  async read(
    cards: ModelCards,
    routing: Pick<Routing, 'config' | 'update'>,
    signal: AbortSignal,
  ): Promise<SluiceConfig | undefined> {
    try {
      await cards.refresh(routing.config, signal);
    } catch (err) {
      if (!signal.aborted) this.log.warn({ err: (err as Error).message }, 'model cards not read');
      return undefined;
    }
    if (signal.aborted) return undefined;
    const next = this.next(routing.config, cards);
    if (next !== undefined) routing.update(next);
    return next;
  }

  /**
   * The configuration to route by, given what `cards` last read; undefined when the routes
   * stay as they are. Never throws.
   */
  next(current: SluiceConfig, cards: Pick<ModelCards, 'listed'>): SluiceConfig | undefined {
    try {
      let next = current;
      for (const pool of current.pools) {
        const listed = cards.listed(pool.name);
        if (listed === undefined || listed.length === 0) continue;
        const named = this.configured.pools.find((p) => p.name === pool.name)?.models ?? [];
        const models =
          named.length === 0
            ? listed.map((m) => m.id)
            : [
                ...named,
                ...listed
                  .filter((m) => m.parent !== undefined && named.includes(m.parent))
                  .map((m) => m.id),
              ];
        const followed = withDiscoveredModels(next, pool.name, models, (model, reason) =>
          this.refused(pool.name, model, reason),
        );
        const now = followed.pools.find((p) => p.name === pool.name)!.models;
        if (now.length === 0 || sameList(now, pool.models)) continue;
        this.log.info(
          {
            pool: pool.name,
            added: now.filter((m) => !pool.models.includes(m)),
            removed: pool.models.filter((m) => !now.includes(m)),
          },
          "pool's routed models follow its engines' /v1/models",
        );
        next = followed;
      }
      return next === current ? undefined : next;
    } catch (err) {
      this.log.warn({ err: (err as Error).message }, "routes not updated from the engines' models");
      return undefined;
    }
  }

  private refused(pool: string, model: string, reason: string): void {
    const key = JSON.stringify([pool, model, reason]);
    if (this.reported.has(key)) return;
    this.reported.add(key);
    this.log.warn({ pool, model, reason }, 'a model the engines list is not routed');
  }
}

const sameList = (a: readonly string[], b: readonly string[]) =>
  a.length === b.length && a.every((m, i) => m === b[i]);
