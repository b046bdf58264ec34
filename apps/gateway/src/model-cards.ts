// What GET /v1/models lists: the engines' own model cards where they name a routed model, so
// a client reads the same `max_model_len`, `root`, `parent` and `owned_by` it would from vLLM
// (`show_available_models`, vllm/entrypoints/openai/models/serving.py; serving_models.py in
// older releases); a card of Sluice's own for a model no engine has described yet (engine
// away, an alias, a pass-through model).
import type { EngineConfig, SluiceConfig } from '@sluice/config';
import { request } from 'undici';

/** A model as `/v1/models` lists it; fields beyond these pass through as the engine wrote them. */
export interface ModelCard {
  id: string;
  object: 'model';
  created: number;
  owned_by: string;
  [field: string]: unknown;
}

/** One answer bounds a card list: vLLM's is a few hundred bytes per model. */
const MAX_MODELS_BYTES = 1024 * 1024;
const TIMEOUT_MS = 2000;

export class EngineModelsError extends Error {
  readonly code = 'ERR_SLUICE_ENGINE_MODELS';
}

/**
 * The cards an engine's `GET /v1/models` lists. Throws `EngineModelsError` for an answer that
 * is not an OpenAI model list; cards without a string id are left out.
 */
export async function fetchModelCards(
  engine: Pick<EngineConfig, 'url' | 'apiKey'>,
  signal: AbortSignal,
): Promise<ModelCard[]> {
  const res = await request(new URL('/v1/models', engine.url), {
    headers: engine.apiKey ? { authorization: `Bearer ${engine.apiKey}` } : {},
    headersTimeout: TIMEOUT_MS,
    bodyTimeout: TIMEOUT_MS,
    signal,
  });
  const length = Number(res.headers['content-length'] ?? 0);
  if (res.statusCode !== 200 || length > MAX_MODELS_BYTES) {
    await res.body.dump();
    throw new EngineModelsError(
      res.statusCode !== 200
        ? `GET /v1/models answered ${res.statusCode}`
        : `GET /v1/models answered ${length} bytes, more than ${MAX_MODELS_BYTES}`,
    );
  }
  const body = (await res.body.json().catch(() => undefined)) as { data?: unknown } | undefined;
  if (!body || !Array.isArray(body.data))
    throw new EngineModelsError('GET /v1/models answered no `data` list');
  return body.data
    .filter(
      (card): card is Record<string, unknown> =>
        typeof card === 'object' && card !== null && typeof card.id === 'string',
    )
    .map((card) => ({
      created: 0,
      owned_by: 'vllm',
      ...card,
      id: card['id'] as string,
      object: 'model',
    }));
}

/**
 * How often a replica reads its engines' cards again: an engine restarted with new flags, a
 * LoRA adapter loaded or unloaded at runtime (and routed from then on: discovery.ts).
 */
export const MODEL_CARDS_REFRESH_MS = 60_000;

/**
 * A model an engine lists: its id, and for a LoRA adapter the model it runs on (vLLM's
 * `ModelCard.parent`: the adapter's base model, else the engine's first served model;
 * `show_available_models`, vllm/entrypoints/openai/models/serving.py). Undefined for a base
 * model (vLLM writes null).
 */
export interface ListedModel {
  readonly id: string;
  readonly parent: string | undefined;
}

const ownCard = (id: string): ModelCard => ({
  id,
  object: 'model',
  created: 0,
  owned_by: 'sluice',
});

/** The cards of each pool's engines, by pool: a pool's model is described by its own engines only. */
export class ModelCards {
  private byPool = new Map<string, Map<string, ModelCard>>();

  /** Per pool, the first engine that answers; a pool whose engines are all away keeps its cards. */
  async refresh(config: SluiceConfig, signal: AbortSignal): Promise<void> {
    for (const pool of config.pools)
      for (const engine of pool.engines) {
        const cards = await fetchModelCards(engine, signal).catch(() => undefined);
        if (signal.aborted) return;
        if (!cards) continue;
        this.byPool.set(pool.name, new Map(cards.map((card) => [card.id, card])));
        break;
      }
  }

  /**
   * What the pool's engines listed at the last read that reached one, in their order;
   * undefined before any did.
   */
  listed(pool: string): ListedModel[] | undefined {
    const cards = this.byPool.get(pool);
    if (cards === undefined) return undefined;
    return [...cards.values()].map((card) => ({
      id: card.id,
      parent: typeof card['parent'] === 'string' ? card['parent'] : undefined,
    }));
  }

  /**
   * Every routed model once: pools' models first, then pass-through models, as configured.
   * A pool's models include what its engines list beyond the configuration once the routing
   * follows them (discovered models, LoRA adapters: discovery.ts).
   */
  list(config: SluiceConfig): ModelCard[] {
    return [
      ...config.pools.flatMap((pool) =>
        pool.models.map((id) => this.byPool.get(pool.name)?.get(id) ?? ownCard(id)),
      ),
      ...config.passthrough.map((p) => ownCard(p.model)),
    ];
  }
}
