// Runs the real `sluice engine-sim` process on a free port.
import { fileURLToPath } from 'node:url';
import { startProcess, type StartedProcess } from './process.ts';

export const repoRoot = fileURLToPath(new URL('../..', import.meta.url));
export const sluiceBin = fileURLToPath(new URL('../../apps/cli/dist/main.js', import.meta.url));

export interface TestEngineSim {
  readonly url: string;
  readonly process: StartedProcess;
  /** GET /sim/state */
  state(): Promise<
    Record<string, unknown> & {
      running: number;
      waiting: number;
      usedBlocks: number;
      kvUsage: number;
      peakRequests: number;
    }
  >;
  /** PUT /sim/faults */
  setFaults(patch: Record<string, unknown>): Promise<Response>;
  metricsText(): Promise<string>;
  stop(): Promise<void>;
}

export async function startEngineSim(
  args: string[] = [],
  env: Record<string, string> = {},
): Promise<TestEngineSim> {
  const proc = await startProcess({
    command: process.execPath,
    args: [sluiceBin, 'engine-sim', '--port', '0', ...args],
    name: 'engine-sim',
    env: { LOG_LEVEL: 'info', ...env },
    ready: /"url":"([^"]+)".*"msg":"engine-sim ready"/,
  });
  const url = proc.ready[1]!;
  return {
    url,
    process: proc,
    async state() {
      const res = await fetch(`${url}/sim/state`);
      return (await res.json()) as Awaited<ReturnType<TestEngineSim['state']>>;
    },
    setFaults: (patch) =>
      fetch(`${url}/sim/faults`, {
        method: 'PUT',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify(patch),
      }),
    async metricsText() {
      return (await fetch(`${url}/metrics`)).text();
    },
    stop: () => proc.stop(),
  };
}

/**
 * Re-evaluates `check` after each macrotask until it holds; for state another process owns.
 * The time-out is a ceiling against a wedged process, not a speed requirement: generous, so
 * a loaded CI machine does not turn slowness into a failure.
 */
export async function eventually<T>(
  check: () => Promise<T | undefined> | T | undefined,
  what: string,
  timeoutMs = 30_000,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await check();
    if (value !== undefined && value !== false) return value as T;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
}
