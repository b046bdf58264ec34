// The Grafana dashboard and the alert rules in deploy/ may only use metrics Sluice exports.
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { Registry } from 'prom-client';
import { describe, expect, it } from 'vitest';
import { dispatcherMetrics, gatewayMetrics } from '../src/metrics.ts';

const deploy = (path: string) =>
  readFileSync(fileURLToPath(new URL(`../../../deploy/${path}`, import.meta.url)), 'utf8');

async function exported(): Promise<Set<string>> {
  const registry = new Registry();
  gatewayMetrics(registry);
  dispatcherMetrics(registry);
  const names = new Set<string>();
  for (const m of await registry.getMetricsAsJSON()) {
    names.add(m.name);
    if (String(m.type) === 'histogram')
      for (const s of ['_bucket', '_sum', '_count']) names.add(m.name + s);
  }
  return names;
}

describe('deploy/ references only exported metrics', () => {
  it.each(['grafana/sluice-dashboard.json', 'prometheus/sluice-rules.yaml'])('%s', async (file) => {
    const names = await exported();
    const used = new Set(deploy(file).match(/sluice_[a-z_]+/g) ?? []);
    expect(used.size).toBeGreaterThan(3);
    for (const name of used) expect(names, `${file} uses ${name}`).toContain(name);
  });
});
