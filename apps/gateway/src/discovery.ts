// Fills in the model of a pool configured by VLLM_URL without VLLM_MODEL, from the
// engine's /v1/models, retrying while the engine starts.
import { withDiscoveredModels, type SluiceConfig } from '@sluice/config';
import { request } from 'undici';

export async function discoverModels(
  config: SluiceConfig,
  timeoutMs: number,
  log: { warn(o: object, m: string): void },
): Promise<SluiceConfig> {
  let next = config;
  for (const pool of config.pools) {
    if (pool.models.length > 0) continue;
    const engine = pool.engines[0]!;
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      try {
        const res = await request(new URL('/v1/models', engine.url), {
          headers: engine.apiKey ? { authorization: `Bearer ${engine.apiKey}` } : {},
          headersTimeout: 2000,
          bodyTimeout: 2000,
        });
        const body = (await res.body.json()) as { data?: Array<{ id?: unknown }> };
        const models = (body.data ?? [])
          .map((m) => m.id)
          .filter((id): id is string => typeof id === 'string');
        if (res.statusCode !== 200 || models.length === 0)
          throw new Error(`GET /v1/models answered ${res.statusCode} with no model`);
        next = withDiscoveredModels(next, pool.name, models);
        break;
      } catch (err) {
        if (Date.now() > deadline)
          throw new Error(
            `cannot discover the model of ${engine.url} (set VLLM_MODEL): ${(err as Error).message}`,
          );
        log.warn(
          { engine: engine.url, err: (err as Error).message },
          'engine not answering /v1/models yet; retrying',
        );
        await new Promise((resolve) => setTimeout(resolve, 500));
      }
    }
  }
  return next;
}
