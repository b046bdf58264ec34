// Where models go, as far as this replica knows yet: pools configured by VLLM_URL without
// VLLM_MODEL learn their model names from the engine after the gateway is listening.
import { createRouter, type Router, type SluiceConfig } from '@sluice/config';

export class Routing {
  private current: { config: SluiceConfig; router: Router; known: boolean };

  constructor(config: SluiceConfig) {
    this.current = Routing.build(config);
  }

  get config(): SluiceConfig {
    return this.current.config;
  }

  get router(): Router {
    return this.current.router;
  }

  /** False while some pool's model names are still being discovered. */
  get known(): boolean {
    return this.current.known;
  }

  update(config: SluiceConfig): void {
    this.current = Routing.build(config);
  }

  private static build(config: SluiceConfig) {
    return {
      config,
      router: createRouter(config),
      known: config.pools.every((p) => p.models.length > 0),
    };
  }
}
