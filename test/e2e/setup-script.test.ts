// scripts/setup.sh (the README's first command) on a machine that lacks the test-only tools:
// it still installs the npm dependencies and builds, and names each missing tool with the
// tests that need it, exit 0 (exit 1 under CI, whose test run needs them all, and without
// redis-server, which `sluice up` needs). Run in a copy of the script against a PATH of its
// own: fake `npm` and `redis-server` that record what they were asked, no apt-get (nothing
// is installed), and only the tools each case grants.
import { execFile } from 'node:child_process';
import {
  chmodSync,
  copyFileSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  rmSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { repoRoot } from '../support/index.ts';

/** What the script needs from the system besides the tools under test. */
const BASICS = ['node', 'sha256sum', 'cut', 'cat', 'sed', 'awk', 'id', 'head', 'dirname', 'mkdir'];
const TEST_TOOLS = ['promtool', 'prometheus', 'chromium', 'kubectl'];

const dirs: string[] = [];
afterEach(() => {
  for (const dir of dirs.splice(0)) rmSync(dir, { recursive: true, force: true });
});

function which(tool: string): string {
  for (const dir of ['/usr/local/bin', '/usr/bin', '/bin']) {
    const path = join(dir, tool);
    if (existsSync(path)) return path;
  }
  throw new Error(`${tool} is not on this machine`);
}

function script(path: string, body: string) {
  writeFileSync(path, `#!/bin/bash\n${body}\n`);
  chmodSync(path, 0o755);
}

/** A checkout with the script, its own bin directory holding `tools`, and a log of npm calls. */
function machine(tools: { redis: boolean; testTools: string[] }) {
  const root = mkdtempSync(join(tmpdir(), 'sluice-setup-'));
  dirs.push(root);
  mkdirSync(join(root, 'scripts'));
  copyFileSync(join(repoRoot, 'scripts', 'setup.sh'), join(root, 'scripts', 'setup.sh'));
  writeFileSync(join(root, 'package-lock.json'), '{}\n');
  const bin = join(root, 'bin');
  mkdirSync(bin);
  for (const tool of BASICS) symlinkSync(which(tool), join(bin, tool));
  const log = join(root, 'npm.log');
  // `npm ci` makes node_modules, where the script keeps its lockfile stamp.
  script(join(bin, 'npm'), `echo "$*" >> '${log}'\n[ "$1" != ci ] || mkdir -p node_modules`);
  if (tools.redis) script(join(bin, 'redis-server'), 'echo "Redis server v=7.2.4 sha=0"');
  for (const tool of tools.testTools) script(join(bin, tool), `echo "${tool} 1.0"`);
  return { root, bin, npmCalls: () => (existsSync(log) ? readFileSync(log, 'utf8') : '') };
}

function setup(m: ReturnType<typeof machine>, env: Record<string, string> = {}) {
  return new Promise<{ code: number; stdout: string; stderr: string }>((resolve) => {
    execFile(
      '/bin/bash',
      [join(m.root, 'scripts', 'setup.sh')],
      { env: { PATH: m.bin, HOME: m.root, ...env } },
      (err, stdout, stderr) => {
        const code = err ? ((err as { code?: number }).code ?? -1) : 0;
        resolve({ code, stdout, stderr });
      },
    );
  });
}

describe('scripts/setup.sh', () => {
  it('installs and builds without the test tools, names each with its tests, and exits 0', async () => {
    const m = machine({ redis: true, testTools: [] });
    const { code, stdout, stderr } = await setup(m);
    expect({ code, stderr }).toEqual({ code: 0, stderr: expect.any(String) });
    expect(m.npmCalls()).toMatch(/^ci .*\nrun --silent build\n$/);
    for (const [tool, test] of [
      ['promtool', 'prometheus-rules.test.ts'],
      ['prometheus', 'prometheus-live.test.ts'],
      ['chromium', 'status-page.test.ts'],
      ['kubectl', 'deploy-bundle.test.ts'],
    ])
      expect(stderr).toMatch(new RegExp(`warning: ${tool} is not on the PATH.*${test}`));
    expect(stdout).toContain('ready for `sluice up`');
  });

  it('under CI, still builds, then exits 1 for a missing test tool', async () => {
    const m = machine({ redis: true, testTools: ['promtool', 'prometheus', 'chromium'] });
    const { code, stderr } = await setup(m, { CI: 'true' });
    expect(code).toBe(1);
    expect(m.npmCalls()).toContain('run --silent build');
    expect(stderr).toMatch(/warning: kubectl is not on the PATH.*deploy-bundle\.test\.ts/);
    expect(stderr).toContain('CI is set and 1 test tool(s) are missing');
  });

  it('exits 1 without redis-server, after the install and build', async () => {
    const m = machine({ redis: false, testTools: TEST_TOOLS });
    const { code, stderr } = await setup(m);
    expect(code).toBe(1);
    expect(m.npmCalls()).toContain('run --silent build');
    expect(stderr).toContain('redis-server >= 6.2 is not on the PATH');
  });
});
