export { loadConfig, type ReadFile } from './load.js';
export { describeVariables, VLLM_DEFAULT_MAX_NUM_SEQS } from './variables.js';
export { ConfigError } from './errors.js';
export { maskCredentials } from './rules.js';
export { defaultDegradation } from './degradation.js';
export { keyDigest, MIN_TENANT_KEY_LENGTH } from './tenants.js';
export {
  createRouter,
  passthroughForModel,
  poolForModel,
  withDiscoveredModels,
  type Route,
  type Router,
} from './router.js';
export type {
  CorsConfig,
  DegradationConfig,
  DegradationProfile,
  DegradationSignal,
  EngineConfig,
  EngineLane,
  GpuSource,
  LongPromptConfig,
  MaxInflightSource,
  PassthroughConfig,
  TenantConfig,
  PoolConfig,
  RedisAccess,
  RedisAddress,
  RedisConfig,
  RedisTopology,
  SluiceConfig,
  SystemPromptMode,
} from './types.js';
