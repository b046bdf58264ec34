// The shipped alert rules load in Prometheus' own checker and pass their unit tests
// (deploy/prometheus/sluice-rules.test.yaml: two pools losing one leader, two installs in two
// namespaces with the same pool name, the standby case, every alert), with Debian's `promtool`
// (scripts/setup.sh installs it).
import { execFile } from 'node:child_process';
import { copyFileSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';
import { repoRoot } from '../support/index.ts';

const run = promisify(execFile);
const dir = join(repoRoot, 'deploy', 'prometheus');

/** promtool's exit status and output; a failing check is an answer, not a throw. */
async function promtool(cwd: string, ...args: string[]) {
  try {
    const { stdout, stderr } = await run('promtool', args, { cwd });
    return { code: 0, output: stdout + stderr };
  } catch (err) {
    const e = err as { code?: number; stdout?: string; stderr?: string };
    return { code: e.code ?? -1, output: `${e.stdout ?? ''}${e.stderr ?? ''}` };
  }
}

describe('shipped Prometheus rules', () => {
  it('pass `promtool check rules`', async () => {
    const result = await promtool(dir, 'check', 'rules', 'sluice-rules.yaml');
    expect(result.output).toMatch(/SUCCESS: \d+ rules found/);
    expect(result.code).toBe(0);
  });

  it('pass their unit tests (`promtool test rules`)', async () => {
    const result = await promtool(dir, 'test', 'rules', 'sluice-rules.test.yaml');
    expect(result.output).toContain('SUCCESS');
    expect(result.code).toBe(0);
  });

  it('fail a unit test that expects the wrong alert: the runner is not vacuous', async () => {
    // The same rules against a test that expects SluiceNoLeader for a pool, fed the gauge the
    // rule reads. Where the gateways see a leader (1) the test must fail with no alert; where
    // they see none (0) the alert fires, so the failure is the rule's answer to the value, not
    // a series the rule does not read (which fails the test whatever the rule does).
    const tmp = mkdtempSync(join(tmpdir(), 'sluice-rules-'));
    const expectNoLeader = (values: string) => {
      writeFileSync(
        join(tmp, 'wrong.test.yaml'),
        [
          'rule_files: [sluice-rules.yaml]',
          'evaluation_interval: 15s',
          'tests:',
          '  - interval: 15s',
          '    input_series:',
          `      - { series: 'sluice_pool_has_leader{instance="g1",pool="a"}', values: '${values}' }`,
          '    alert_rule_test:',
          '      - eval_time: 4m',
          '        alertname: SluiceNoLeader',
          '        exp_alerts: [{ exp_labels: { severity: critical, pool: a } }]',
          '',
        ].join('\n'),
      );
      return promtool(tmp, 'test', 'rules', 'wrong.test.yaml');
    };
    try {
      copyFileSync(join(dir, 'sluice-rules.yaml'), join(tmp, 'sluice-rules.yaml'));
      const wrong = await expectNoLeader('1x20');
      expect(wrong.code).not.toBe(0);
      expect(wrong.output).toMatch(/alertname: SluiceNoLeader[\s\S]*got:\s*\[\]/);
      // Not a pass: the test leaves out the rule's summary. What it got is the alert.
      const none = await expectNoLeader('0x20');
      expect(none.output).toMatch(
        /got:\s*\[\s*0:\s*Labels:\{alertname="SluiceNoLeader", pool="a", severity="critical"\}/,
      );
    } finally {
      rmSync(tmp, { recursive: true, force: true });
    }
  });
});
