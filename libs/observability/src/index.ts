export {
  dispatcherMetrics,
  gatewayMetrics,
  type DispatcherMetrics,
  type GatewayMetrics,
} from './metrics.js';
export { loggerOptions } from './logger.js';
export { Registry, collectDefaultMetrics } from 'prom-client';
