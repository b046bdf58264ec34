export {
  dispatcherMetrics,
  gatewayMetrics,
  primeRejected,
  type DispatcherMetrics,
  type GatewayMetrics,
  type GatewayReadings,
} from './metrics.js';
export { loggerOptions } from './logger.js';
export { gaugeSeries, type GaugeSeries } from './gauge-series.js';
export { Registry, collectDefaultMetrics } from 'prom-client';
export {
  markStage,
  requestStages,
  STAGE_CHANNEL,
  type RequestStage,
  type StageMark,
} from './stages.js';
