import { Registry } from 'prom-client';
import { describe, expect, it } from 'vitest';
import { dispatcherMetrics, gatewayMetrics, primeRejected } from '../src/metrics.ts';

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

  it('primeRejected creates each model and reason at 0, and leaves a count there as it is', async () => {
    const registry = new Registry();
    const metrics = gatewayMetrics(registry);
    metrics.rejected.inc({ model: 'a', reason: 'queue_full' }, 3);
    primeRejected(metrics, ['a', 'b'], ['queue_full', 'dispatcher_lost']);
    primeRejected(metrics, ['a', 'b'], ['queue_full', 'dispatcher_lost']);
    const series = (await metrics.rejected.get()).values.map((v) => [
      v.labels['model'],
      v.labels['reason'],
      v.value,
    ]);
    expect(series).toEqual(
      expect.arrayContaining([
        ['a', 'queue_full', 3],
        ['a', 'dispatcher_lost', 0],
        ['b', 'queue_full', 0],
        ['b', 'dispatcher_lost', 0],
      ]),
    );
    expect(series).toHaveLength(4);
  });

  it('sluice_pool_has_leader is read at each scrape: 1, 0, or no series when unknown', async () => {
    const registry = new Registry();
    let leaders: [string, boolean | undefined][] = [
      ['a', true],
      ['b', false],
      ['c', undefined],
    ];
    let redisUp = true;
    gatewayMetrics(registry, { poolLeaders: async () => leaders, redisUp: () => redisUp });
    const read = async () =>
      ((await registry.getSingleMetric('sluice_pool_has_leader')!.get()).values ?? []).map((v) => [
        v.labels['pool'],
        v.value,
      ]);
    expect(await read()).toEqual([
      ['a', 1],
      ['b', 0],
    ]);
    // The next scrape reads again: a pool whose reading became unknown loses its series.
    leaders = [
      ['a', undefined],
      ['b', true],
    ];
    expect(await read()).toEqual([['b', 1]]);
    // sluice_redis_up is read at each scrape too, and stays through an outage.
    const redis = async () => (await registry.getSingleMetric('sluice_redis_up')!.get()).values;
    expect((await redis()).map((v) => v.value)).toEqual([1]);
    redisUp = false;
    expect((await redis()).map((v) => v.value)).toEqual([0]);
  });
});
