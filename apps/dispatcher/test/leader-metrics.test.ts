// One exporter per fact: a pool's gauges leave /metrics while this dispatcher does not lead
// the pool and come back, with the values read meanwhile, once it leads again.
import { dispatcherMetrics, Registry } from '@sluice/observability';
import { describe, expect, it } from 'vitest';
import {
  exportLedPoolsOnly,
  LEADER_ONLY_METRICS,
  PER_DISPATCHER_GAUGES,
} from '../src/leader-metrics.ts';

function setUp() {
  const registry = new Registry();
  const metrics = dispatcherMetrics(registry);
  const led = new Set<string>();
  exportLedPoolsOnly(metrics, (pool) => led.has(pool));
  return { registry, metrics, led };
}

const lines = async (registry: Registry, name: string) =>
  (await registry.metrics()).split('\n').filter((l) => l.startsWith(`${name}{`));

describe('exportLedPoolsOnly', () => {
  it("exports a pool's gauges only while this dispatcher leads it", async () => {
    const { registry, metrics, led } = setUp();
    for (const pool of ['a', 'b']) {
      metrics.queueDepth.set({ pool, state: 'wait' }, 3);
      metrics.engineBypass.set({ pool, engine: 'e0' }, 4);
      metrics.leader.set({ pool }, pool === 'a' ? 1 : 0);
      metrics.inflight.set({ pool, engine: 'e0' }, 0);
    }
    led.add('a');
    expect(await lines(registry, 'sluice_queue_depth')).toEqual([
      'sluice_queue_depth{pool="a",state="wait"} 3',
    ]);
    expect(await lines(registry, 'sluice_engine_bypass_requests')).toEqual([
      'sluice_engine_bypass_requests{pool="a",engine="e0"} 4',
    ]);
    // Per-dispatcher gauges stay for every pool.
    expect(await lines(registry, 'sluice_leader')).toHaveLength(2);
    expect(await lines(registry, 'sluice_inflight')).toHaveLength(2);

    // The lease moves: nothing of pool a is exported from the next collection on.
    led.delete('a');
    expect(await lines(registry, 'sluice_queue_depth')).toEqual([]);
    // The reading goes on and is exported again, as it is now, once the lease is back.
    metrics.queueDepth.set({ pool: 'a', state: 'wait' }, 5);
    led.add('a');
    expect(await lines(registry, 'sluice_queue_depth')).toEqual([
      'sluice_queue_depth{pool="a",state="wait"} 5',
    ]);
    // The JSON view (what a status page may read) follows the same rule.
    led.clear();
    const json = await registry.getMetricsAsJSON();
    expect(json.find((m) => m.name === 'sluice_queue_depth')!.values).toEqual([]);
  });

  it('classifies every gauge labelled with pool: leader-only or per dispatcher', async () => {
    const metrics = dispatcherMetrics(new Registry());
    const pooled: string[] = [];
    for (const [key, metric] of Object.entries(metrics)) {
      const { labelNames } = metric as unknown as { labelNames: string[] };
      if (String((await metric.get()).type) === 'gauge' && labelNames.includes('pool'))
        pooled.push(key);
    }
    expect(pooled.sort()).toEqual([...LEADER_ONLY_METRICS, ...PER_DISPATCHER_GAUGES].sort());
  });
});
