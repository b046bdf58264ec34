// The `sluice` command as a user runs it.
import { execFile } from 'node:child_process';
import { readFileSync, statSync } from 'node:fs';
import { promisify } from 'node:util';
import { eventually, freePort, sluiceBin, startProcess } from '@sluice/test/support';
import { describe, expect, it } from 'vitest';

const run = promisify(execFile);

async function sluice(args: string[], env: Record<string, string> = {}) {
  try {
    const { stdout, stderr } = await run(process.execPath, [sluiceBin, ...args], {
      env: { ...process.env, ...env },
    });
    return { code: 0, stdout, stderr };
  } catch (err) {
    const e = err as { code: number; stdout: string; stderr: string };
    return { code: e.code, stdout: e.stdout, stderr: e.stderr };
  }
}

describe('sluice command', () => {
  it('is an executable file, so `npx sluice` runs it', () => {
    expect(statSync(sluiceBin).mode & 0o111).not.toBe(0);
    expect(readFileSync(sluiceBin, 'utf8').startsWith('#!/usr/bin/env node\n')).toBe(true);
  });

  it('prints usage with the commands', async () => {
    const { code, stdout } = await sluice(['--help']);
    expect(code).toBe(0);
    expect(stdout).toMatch(/up\s+run a local stack/);
    expect(stdout).toMatch(/engine-sim/);
  });

  it('refuses an unknown command with exit 2', async () => {
    const { code, stderr } = await sluice(['launch']);
    expect(code).toBe(2);
    expect(stderr).toMatch(/unknown command "launch"/);
  });

  it('prints engine-sim --help with flags and defaults', async () => {
    const { code, stdout } = await sluice(['engine-sim', '--help']);
    expect(code).toBe(0);
    expect(stdout).toMatch(/--profile <value>.*default homelab/);
  });

  it('stops engine-sim on a bad value with one line naming it and exit 2', async () => {
    const { code, stderr } = await sluice(['engine-sim', '--max-num-seqs', '-1']);
    expect(code).toBe(2);
    expect(stderr.trim().split('\n')).toEqual([
      'sluice engine-sim: --max-num-seqs="-1" is invalid: expected an integer >= 1',
    ]);
  });

  it.each(['gateway', 'dispatcher'])(
    'stops %s on a bad variable with one line naming it and exit 2',
    async (command) => {
      const { code, stderr } = await run(process.execPath, [sluiceBin, command], {
        env: { ...process.env, ADMISSION_KV_THRESHOLD: '1.5', VLLM_URL: 'http://127.0.0.1:1' },
      }).then(
        () => ({ code: 0, stderr: '' }),
        (err: { code: number; stderr: string }) => err,
      );
      expect(code).toBe(2);
      expect(stderr.trim().split('\n')).toEqual([
        `sluice ${command}: ADMISSION_KV_THRESHOLD="1.5" is invalid: expected a number > 0 and <= 1`,
      ]);
    },
  );

  it('up starts redis-server, the simulator, two gateways and two dispatchers, serves through them, and stops everything on SIGTERM', async () => {
    const [redisPort, enginePort] = [await freePort(), await freePort()];
    const up = await startProcess({
      command: process.execPath,
      args: [sluiceBin, 'up'],
      env: {
        SLUICE_REDIS_PORT: String(redisPort),
        SLUICE_ENGINE_PORT: String(enginePort),
        PORT: '0',
        METRICS_PORT: '0',
        HOST: '127.0.0.1',
        REDIS_URL: '',
        VLLM_URL: '',
      },
      ready: /^try: curl/,
      // Six processes start one after another: a ceiling for a loaded machine, not a speed
      // (one start took 30 s, another over 50 s, at a load average of 19 on two cores).
      timeoutMs: 100_000,
    });
    let gateways: string[] = [];
    try {
      const printed = up.output.join('\n');
      expect(printed).toContain(`redis        redis://127.0.0.1:${redisPort}`);
      expect(printed).toContain(`engine       http://127.0.0.1:${enginePort}`);
      gateways = [...printed.matchAll(/gateway +(http:\/\/\S+)/g)].map((m) => m[1]!);
      expect(gateways).toHaveLength(2);
      expect([...printed.matchAll(/dispatcher +http/g)]).toHaveLength(2);
      for (const url of gateways) {
        const res = await fetch(`${url}/v1/chat/completions`, {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify({
            model: 'reasoning',
            messages: [{ role: 'user', content: 'hi' }],
            max_tokens: 2,
          }),
        });
        expect(res.status).toBe(200);
        expect(res.headers.get('x-sluice-engine')).toBe(`127.0.0.1:${enginePort}`);
      }
      // `sluice status` reads what the leading dispatcher publishes every second.
      const status = await eventually(async () => {
        const { code, stdout } = await sluice(['status'], {
          REDIS_URL: `redis://127.0.0.1:${redisPort}`,
        });
        // A snapshot taken after the requests above finished (they are published every second).
        return code === 0 &&
          stdout.includes('state healthy') &&
          stdout.includes('active 0') &&
          stdout.includes('in-flight 0/4')
          ? stdout
          : undefined;
      }, 'sluice status to show the pool');
      expect(status.split('\n')[0]).toBe(`redis: single redis://127.0.0.1:${redisPort}`);
      expect(status).toMatch(
        /^pool default {2}mode open {2}leader dispatcher-[12] {2}drain \d+\.\d\d\/s {2}load normal {2}queue: wait 0 prioritized 0 active 0 held 0 {2}oldest 0\.0 s$/m,
      );
      // Gauges are as of the last scrape, which may have caught a request above: not pinned.
      expect(status).toMatch(
        new RegExp(
          `^  engine 127\\.0\\.0\\.1:${enginePort}  in-flight 0/4  gate open  state healthy  running \\d+ waiting \\d+ kv \\d+\\.\\d%  read \\d+\\.\\d s ago$`,
          'm',
        ),
      );
    } finally {
      // Whatever failed above, the stack must not outlive the test.
      await up.stop('SIGTERM');
    }
    await expect(fetch(`http://127.0.0.1:${enginePort}/health`)).rejects.toThrow();
    await expect(fetch(`${gateways[0]}/healthz`)).rejects.toThrow();
  }, 180_000);
});
