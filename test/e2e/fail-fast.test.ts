// Fail fast and loud: a process that cannot listen exits non-zero with one line on stderr
// naming the address and why, and really exits; `sluice up` names a child that failed, with
// its last lines, and exits non-zero without SLUICE_UP_VERBOSE.
import { createServer, type Server } from 'node:net';
import { readdirSync, readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import {
  freePort,
  sluiceBin,
  startEngineSim,
  startProcess,
  startRedis,
  type StartedProcess,
  stoppedAfterEach,
} from '../support/index.ts';

const cleanup = stoppedAfterEach();

/** A port something else already listens on. */
async function takenPort(): Promise<number> {
  const server: Server = createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  cleanup.push({ stop: () => new Promise((resolve) => server.close(() => resolve())) });
  return (server.address() as { port: number }).port;
}

/** Runs `sluice ...` until it prints `first`, then to its exit. */
async function sluice(args: string[], env: Record<string, string>, first: RegExp) {
  const proc: StartedProcess = await startProcess({
    command: process.execPath,
    args: [sluiceBin, ...args],
    env: { LOG_LEVEL: 'info', HOST: '127.0.0.1', ...env },
    ready: first,
    timeoutMs: 50_000,
  });
  cleanup.push(proc);
  return { proc, ...(await proc.closed) };
}

describe('a port that is taken', () => {
  it.each([
    ['gateway', 'PORT'],
    ['dispatcher', 'METRICS_PORT'],
  ])('stops %s with exit 1 and one line naming the address', async (command, variable) => {
    const port = await takenPort();
    // A Redis that is there: nothing but the port stands in the way.
    const redis = await startRedis();
    cleanup.push(redis);
    const { proc, code } = await sluice(
      [command],
      {
        REDIS_URL: redis.url,
        VLLM_URL: 'http://127.0.0.1:9',
        VLLM_MODEL: 'm',
        PORT: '0',
        METRICS_PORT: '0',
        [variable]: String(port),
      },
      /cannot listen/,
    );
    // `closed` resolved: the process is gone, nothing kept it alive.
    expect(code).toBe(1);
    expect(proc.stderr).toEqual([
      `sluice ${command}: cannot listen on 127.0.0.1:${port}: address already in use`,
    ]);
  });

  it('stops the engine simulator the same way', async () => {
    const port = await takenPort();
    const { proc, code } = await sluice(
      ['engine-sim', '--port', String(port)],
      {},
      /cannot listen/,
    );
    expect(code).toBe(1);
    expect(proc.stderr).toEqual([
      `sluice engine-sim: cannot listen on 127.0.0.1:${port}: address already in use`,
    ]);
  });
});

describe('a configuration the dispatcher cannot run', () => {
  it('refuses no pools with exit 2 and one line, as any refused configuration', async () => {
    const { proc, code } = await sluice(
      ['dispatcher'],
      { REDIS_URL: 'redis://127.0.0.1:9', VLLM_URL: '', SLUICE_CONFIG: '', METRICS_PORT: '0' },
      /sluice dispatcher:/,
    );
    expect(code).toBe(2);
    expect(proc.stderr).toEqual([
      'sluice dispatcher: no pools configured: set VLLM_URL (one engine) or SLUICE_CONFIG (a pools file)',
    ]);
  });
});

/** `sluice up` on free ports, with the children's logs not echoed. */
async function upEnv(overrides: Record<string, string>) {
  return {
    SLUICE_REDIS_PORT: String(await freePort()),
    SLUICE_ENGINE_PORT: String(await freePort()),
    PORT: '0',
    METRICS_PORT: '0',
    REDIS_URL: '',
    VLLM_URL: '',
    SLUICE_UP_VERBOSE: '',
    ...overrides,
  };
}

/** The pids of a process's children (Linux /proc), to find one child of `sluice up`. */
function childrenOf(pid: number): { pid: number; command: string }[] {
  return readdirSync(`/proc/${pid}/task`).flatMap((task) =>
    readFileSync(`/proc/${pid}/task/${task}/children`, 'utf8')
      .split(' ')
      .filter(Boolean)
      .map((child) => ({
        pid: Number(child),
        command: readFileSync(`/proc/${child}/cmdline`, 'utf8').replaceAll('\0', ' '),
      })),
  );
}

describe('sluice up', () => {
  it('names a child that cannot start, with its error, stops the others and exits 1', async () => {
    const port = await takenPort();
    const { proc, code } = await sluice(
      ['up'],
      await upEnv({ PORT: String(port) }),
      /gateway-1 exited/,
    );
    expect(code).toBe(1);
    expect(proc.stderr).toEqual([
      'sluice up: gateway-1 exited (code 1) before it was ready:',
      `sluice gateway: cannot listen on 127.0.0.1:${port}: address already in use`,
    ]);
    // The simulator and the dispatchers it had started are gone with it.
    expect(proc.output.join('\n')).not.toContain('sluice up: local stack running');
  });

  it('takes the stack down and exits 1 when a child dies after start-up', async () => {
    const env = await upEnv({});
    const up = await startProcess({
      command: process.execPath,
      args: [sluiceBin, 'up'],
      env: { HOST: '127.0.0.1', ...env },
      ready: /^try: curl/,
      timeoutMs: 50_000,
    });
    cleanup.push(up);
    const sim = childrenOf(up.child.pid!).find((c) => c.command.includes(' engine-sim '));
    expect(sim).toBeDefined();
    process.kill(sim!.pid, 'SIGKILL');
    const { code } = await up.closed;
    expect(code).toBe(1);
    expect(up.stderr[0]).toBe(
      'sluice up: engine-sim exited (signal SIGKILL); stopping the stack. Its last lines:',
    );
    // Its log so far: the simulator's own ready line is among its last lines.
    expect(up.stderr.join('\n')).toContain('"msg":"engine-sim ready"');
    await expect(fetch(`http://127.0.0.1:${env.SLUICE_ENGINE_PORT}/health`)).rejects.toThrow();
  }, 120_000);

  it('refuses an unknown flag with one line and exit 2, starting nothing', async () => {
    const { proc, code } = await sluice(['up', '--port', '1'], await upEnv({}), /unknown flag/);
    expect(code).toBe(2);
    expect(proc.stderr).toEqual(['sluice up: unknown flag --port (see sluice up --help)']);
    expect(proc.output).toEqual(proc.stderr);
  });
});

describe('sluice engine-sim', () => {
  it('refuses an unknown flag and a stray argument with exit 2', async () => {
    for (const [args, line] of [
      [['--bogus'], 'sluice engine-sim: unknown flag --bogus (see --help)'],
      [['stray'], 'sluice engine-sim: unexpected argument "stray"'],
    ] as const) {
      const { proc, code } = await sluice(['engine-sim', ...args], {}, /sluice engine-sim:/);
      expect(code).toBe(2);
      expect(proc.stderr).toEqual([line]);
    }
    // A correct command line still starts it.
    cleanup.push(await startEngineSim(['--profile', 'instant']));
  });
});
