// Real Sluice processes: `sluice gateway` and `sluice dispatcher`, configured by env.
import { startProcess, type StartedProcess } from './process.ts';
import { eventually, sluiceBin } from './engine-sim.ts';

export interface SluiceProcess {
  readonly url: string;
  readonly process: StartedProcess;
  stop(signal?: NodeJS.Signals): Promise<void>;
}

/** How the harness reads a Sluice process. */
export interface SluiceProcessOptions {
  /** false: the output after the ready line is drained, not kept (StartOptions.keepOutput). */
  keepOutput?: boolean;
}

async function start(
  command: 'gateway' | 'dispatcher',
  env: Record<string, string>,
  options: SluiceProcessOptions = {},
): Promise<SluiceProcess> {
  const proc = await startProcess({
    command: process.execPath,
    args: [sluiceBin, command],
    name: `sluice ${command}`,
    env: { LOG_LEVEL: 'info', HOST: '127.0.0.1', ...env },
    ready: new RegExp(`"url":"([^"]+)".*"msg":"${command} ready"`),
    // A ceiling for a loaded machine, not a speed: a gateway took over 20 s to print its ready
    // line at a load average of 19 on two cores.
    timeoutMs: 45_000,
    keepOutput: options.keepOutput,
  });
  return { url: proc.ready[1]!, process: proc, stop: (signal) => proc.stop(signal) };
}

/** A gateway replica on a free port. */
export function startGateway(
  env: Record<string, string>,
  options?: SluiceProcessOptions,
): Promise<SluiceProcess> {
  return start('gateway', { PORT: '0', ...env }, options);
}

/** A dispatcher whose metrics server listens on a free port. */
export function startDispatcher(env: Record<string, string>): Promise<SluiceProcess> {
  return start('dispatcher', { METRICS_PORT: '0', ...env });
}

/** Resolves once the process answers /readyz with 200 (a gateway: Redis and a leader are there). */
export async function untilReady(proc: SluiceProcess, what = 'the gateway to see a leader') {
  await eventually(
    async () => ((await fetch(`${proc.url}/readyz`)).status === 200 ? true : undefined),
    what,
  );
}
