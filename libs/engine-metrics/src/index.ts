export { parseExposition } from './parse.js';
export { PrometheusParseError } from './errors.js';
export { sampleValue } from './sample-value.js';
export type { Exposition, Labels, MetricFamily, MetricType, Sample } from './types.js';
export { readVllmState, VllmMetricsError, VLLM_SERIES } from './vllm.js';
export type { KvMetricName, VllmMetricsErrorCode, VllmState } from './vllm.js';
export { createEngineObserver } from './observer.js';
export type {
  EngineHealth,
  EngineObserver,
  EngineObserverOptions,
  ObservedEngine,
} from './observer.js';
