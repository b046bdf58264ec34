import { Registry } from 'prom-client';
import { describe, expect, it } from 'vitest';
import { dispatcherMetrics, gatewayMetrics } from '../src/metrics.ts';

describe('metric definitions', () => {
  it('gateway and dispatcher metrics share one registry without clashes, all prefixed sluice_', async () => {
    const registry = new Registry();
    gatewayMetrics(registry);
    dispatcherMetrics(registry);
    const names = (await registry.getMetricsAsJSON()).map((m) => m.name);
    expect(new Set(names).size).toBe(names.length);
    for (const name of names) expect(name).toMatch(/^sluice_[a-z_]+$/);
    expect(names).toEqual(
      expect.arrayContaining([
        'sluice_rejected_total',
        'sluice_queue_depth',
        'sluice_inflight',
        'sluice_inflight_limit',
        'sluice_leader',
        'sluice_ttft_seconds',
        'sluice_queue_wait_seconds',
      ]),
    );
  });

  it('histograms name their base unit: _seconds for times, _tokens for prompt sizes', async () => {
    const registry = new Registry();
    gatewayMetrics(registry);
    dispatcherMetrics(registry);
    const histograms = (await registry.getMetricsAsJSON()).filter(
      (m) => String(m.type) === 'histogram',
    );
    expect(histograms.length).toBeGreaterThan(0);
    for (const h of histograms) expect(h.name).toMatch(/_(seconds|tokens)$/);
  });
});
