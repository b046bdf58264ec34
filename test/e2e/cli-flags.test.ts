// Strict command lines: `sluice --version`, `--help` that starts nothing, and one line with
// exit 2 for a flag or argument a command does not take.
import { readFileSync } from 'node:fs';
import { afterEach, describe, expect, it } from 'vitest';
import { repoRoot, sluiceBin, startProcess, type StartedProcess } from '../support/index.ts';

const cleanup: StartedProcess[] = [];
afterEach(async () => {
  for (const p of cleanup.splice(0)) await p.stop();
});

const { version } = JSON.parse(readFileSync(`${repoRoot}package.json`, 'utf8')) as {
  version: string;
};

/** Runs `sluice ...` to its exit. Nothing it needs is there: a start would hang, not exit. */
async function sluice(args: string[], first: RegExp, env: Record<string, string> = {}) {
  const proc = await startProcess({
    command: process.execPath,
    args: [sluiceBin, ...args],
    // Nothing listens here: a gateway or dispatcher that started would wait for it, not exit.
    env: { REDIS_URL: 'redis://127.0.0.1:9', VLLM_URL: 'http://127.0.0.1:9', PORT: '0', ...env },
    ready: first,
  });
  cleanup.push(proc);
  return { proc, ...(await proc.closed) };
}

describe('sluice --version', () => {
  it.each([['--version'], ['-v'], ['version']])('%s prints the package version', async (flag) => {
    const { proc, code } = await sluice([flag], /^sluice /);
    expect(code).toBe(0);
    expect(proc.output).toEqual([`sluice ${version}`]);
  });
});

describe.each(['gateway', 'dispatcher'])('sluice %s', (command) => {
  it.each([['--help'], ['-h']])(
    '%s prints what configures it and exits 0 without starting',
    async (flag) => {
      const { proc, code } = await sluice([command, flag], /^Usage:/);
      expect(code).toBe(0);
      expect(proc.stderr).toEqual([]);
      expect(proc.output[0]).toBe(`Usage: sluice ${command}`);
      const text = proc.output.join('\n');
      expect(text).toContain('README.md');
      // The variables it reads, from @sluice/config's table.
      expect(text).toMatch(/^\| `REDIS_URL` \|/m);
      expect(text).not.toMatch(/listening|"level"/);
    },
  );

  it.each([
    [['--bogus'], 'unknown flag --bogus'],
    [['--port=8080'], 'unknown flag --port'],
    [['-x'], 'unknown flag -x'],
    [['serve'], 'unexpected argument "serve"'],
  ])('refuses %j with one line and exit 2', async (args, why) => {
    const { proc, code } = await sluice([command, ...args], new RegExp(`^sluice ${command}:`));
    expect(code).toBe(2);
    expect(proc.output).toEqual([`sluice ${command}: ${why} (see sluice ${command} --help)`]);
  });
});

describe('sluice up', () => {
  it('--help prints what it starts and exits 0', async () => {
    const { proc, code } = await sluice(['up', '--help'], /^Usage:/);
    expect(code).toBe(0);
    expect(proc.output[0]).toBe('Usage: sluice up');
    expect(proc.output.join('\n')).toContain('SLUICE_UP_VERBOSE');
  });
});

describe('sluice status --watch', () => {
  it.each([['0.05'], ['2200000']])(
    'refuses --interval %s with one line and exit 2',
    async (seconds) => {
      // 2200000 s is past setTimeout's 2^31-1 ms, where Node fires after 1 ms: a view that
      // started would read Redis in a tight loop, and print frames instead of this line.
      const { proc, code } = await sluice(
        ['status', '--watch', '--interval', seconds],
        /^sluice status:/,
      );
      expect(code).toBe(2);
      expect(proc.output).toEqual([
        `sluice status: --interval="${seconds}" is invalid: expected seconds from 0.1 to 3600`,
      ]);
    },
  );
});

describe.each<[string, string[], Record<string, string>?]>([
  ['status', []],
  ['pool', ['pause', 'default']],
  ['gateway', []],
  // The engine's limit given, so the dispatcher has no warning to log before the refusal.
  ['dispatcher', [], { ADMISSION_MAX_INFLIGHT: '4' }],
])('sluice %s', (command, args, env = {}) => {
  it('refuses a REDIS_TLS_CA_FILE it cannot read with one line and exit 2, as any configuration', async () => {
    const { proc, code } = await sluice([command, ...args], new RegExp(`^sluice ${command}:`), {
      REDIS_URL: 'rediss://127.0.0.1:9',
      REDIS_TLS_CA_FILE: '/nonexistent/ca.pem',
      ...env,
    });
    expect(code).toBe(2);
    expect(proc.output).toEqual([
      `sluice ${command}: REDIS_TLS_CA_FILE="/nonexistent/ca.pem" cannot be read: ENOENT: no such file or directory, open '/nonexistent/ca.pem'`,
    ]);
  });
});
