import { describe, expect, it } from 'vitest';
import { loadConfig } from '../src/index.js';
import { envError } from './helpers.js';

describe('GATEWAY_METRICS_PORT', () => {
  it('is unset by default (/metrics on PORT), and a port of its own when set', () => {
    expect(loadConfig({}).http.gatewayMetricsPort).toBeUndefined();
    expect(loadConfig({ GATEWAY_METRICS_PORT: '9465' }).http).toMatchObject({
      port: 8080,
      gatewayMetricsPort: 9465,
    });
  });

  it("refuses the API's own port", () => {
    const error = envError({ PORT: '9000', GATEWAY_METRICS_PORT: '9000' });
    expect(error.variable).toBe('GATEWAY_METRICS_PORT');
    expect(error.message).toBe(
      'GATEWAY_METRICS_PORT="9000" is invalid: expected a port other than PORT (9000): /metrics gets a listener of its own',
    );
  });
});
