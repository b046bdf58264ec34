export { parseExposition } from './parse.js';
export { PrometheusParseError } from './errors.js';
export { sampleValue } from './sample-value.js';
export type { Exposition, Labels, MetricFamily, MetricType, Sample } from './types.js';
