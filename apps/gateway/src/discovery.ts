// Fills in the model of a pool configured by VLLM_URL without VLLM_MODEL, from the
// engine's /v1/models. Runs after the gateway listens and retries until the engine answers
// (or the gateway closes): an engine that starts after the gateway is routine.
import { setTimeout as sleep } from 'node:timers/promises';
import { withDiscoveredModels, type SluiceConfig } from '@sluice/config';
import { fetchModelCards } from './model-cards.js';

const FIRST_RETRY_MS = 500;
const MAX_RETRY_MS = 5000;

/** Resolves with the config whose pools all have models; rejects only when `signal` aborts. */
export async function discoverModels(
  config: SluiceConfig,
  log: { warn(o: object, m: string): void },
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
