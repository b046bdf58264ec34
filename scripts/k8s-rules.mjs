#!/usr/bin/env node
// Writes deploy/kubernetes/base/prometheus-rule.yaml, the PrometheusRule that carries
// deploy/prometheus/sluice-rules.yaml (the one source of the alerts) into a cluster.
// kustomize cannot read a file outside its directory, hence a generated copy.
//   node scripts/k8s-rules.mjs          # regenerate after editing the rules
//   node scripts/k8s-rules.mjs --check  # exit 1 when the copy is out of date
// test/e2e/deploy-bundle.test.ts fails when the two differ.
import { readFileSync, writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { format, resolveConfig } from 'prettier';
import { parse, stringify } from 'yaml';

const root = fileURLToPath(new URL('..', import.meta.url));
const source = 'deploy/prometheus/sluice-rules.yaml';
const target = 'deploy/kubernetes/base/prometheus-rule.yaml';

const rules = parse(readFileSync(root + source, 'utf8'));
if (!Array.isArray(rules?.groups)) throw new Error(`${source}: expected a top-level groups list`);
const rule = {
  apiVersion: 'monitoring.coreos.com/v1',
  kind: 'PrometheusRule',
  metadata: { name: 'sluice' },
  spec: { groups: rules.groups },
};
// Formatted as `npm run lint` wants it, so a regenerated file passes prettier --check.
const text = await format(
  `# GENERATED from ${source} by scripts/k8s-rules.mjs: edit that file, then run\n` +
    `#   node scripts/k8s-rules.mjs\n` +
    stringify(rule, { lineWidth: 0 }),
  { ...(await resolveConfig(root + target)), filepath: root + target },
);

if (process.argv.includes('--check')) {
  let current = '';
  try {
    current = readFileSync(root + target, 'utf8');
  } catch {
    // missing: out of date
  }
  if (current !== text) {
    process.stderr.write(`${target} is out of date: run node scripts/k8s-rules.mjs\n`);
    process.exit(1);
  }
} else {
  writeFileSync(root + target, text);
  process.stdout.write(`wrote ${target}\n`);
}
