export { loadConfig, type ReadFile } from './load.js';
export { describeVariables } from './variables.js';
export { ConfigError } from './errors.js';
export {
  createRouter,
  passthroughForModel,
  poolForModel,
  withDiscoveredModels,
  type Route,
  type Router,
} from './router.js';
export type {
  EngineConfig,
  GpuSource,
  MaxInflightSource,
  PassthroughConfig,
  PoolConfig,
  SluiceConfig,
} from './types.js';
