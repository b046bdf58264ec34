// `sluice up`: the whole local stack on one machine, as child processes, stopped together.
// Redis comes from the PATH unless REDIS_URL (or a Sentinel or Cluster) is set; the engine
// simulator runs unless VLLM_URL or SLUICE_CONFIG names the engines.
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { strictFlags } from './args.js';

const cliMain = fileURLToPath(new URL('./main.js', import.meta.url));

function exited(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
  return new Promise((resolve) => child.once('exit', () => resolve()));
}

interface Started {
  name: string;
  child: ChildProcess;
  /** Its last lines: those on stderr when it wrote any (a fatal error is there), else stdout's. */
  lastLines(): string[];
  /** The first line that matched `note`, if one was asked for and has come. */
  noted?: RegExpMatchArray;
}

interface ChildOptions {
  /** The line that says it is ready (an info line: children never run above info). */
  ready: RegExp;
  env: Record<string, string | undefined>;
  /** The lowest pino level SLUICE_UP_VERBOSE echoes (the operator's LOG_LEVEL). */
  echoLevel: number;
  /** A line to remember (Started.noted), such as one naming a second address. */
  note?: RegExp;
}

const TAIL_LINES = 10;
/** How often up says which child it is still waiting for, with that child's last line. */
const WAIT_NOTICE_MS = 10_000;

/** pino's number for each level LOG_LEVEL names (libs/config LOG_LEVELS). */
const LEVELS: Readonly<Record<string, number>> = {
  trace: 10,
  debug: 20,
  info: 30,
  warn: 40,
  error: 50,
  fatal: 60,
  silent: Infinity,
};

/**
 * Whether SLUICE_UP_VERBOSE echoes this line of a child's: a pino line below `echoLevel` is
 * not; any other line (redis-server's, a fatal error's) always is.
 */
export function echoed(line: string, echoLevel: number): boolean {
  if (echoLevel <= LEVELS['info']! || !line.startsWith('{')) return true;
  let level: unknown;
  try {
    level = (JSON.parse(line) as { level?: unknown }).level;
  } catch {
    return true;
  }
  return typeof level !== 'number' || level >= echoLevel;
}

/**
 * Spawns a child and resolves with the first output line matching `ready`. `spawned` hears of
 * it at once, before it is ready: a stop during start-up must reach the child being started.
 */
function startChild(
  name: string,
  command: string,
  args: string[],
  { ready, env, echoLevel, note }: ChildOptions,
  spawned: (started: Started) => void,
): Promise<[Started, RegExpMatchArray]> {
  return new Promise((resolve, reject) => {
    const child = spawn(command, args, { stdio: ['ignore', 'pipe', 'pipe'], env });
    const tails = { stdout: [] as string[], stderr: [] as string[] };
    const lastLines = () => (tails.stderr.length > 0 ? tails.stderr : tails.stdout);
    const started: Started = { name, child, lastLines };
    // Without a pid nothing runs (the 'error' below says why): there is nothing to stop.
    if (child.pid !== undefined) spawned(started);
    let settled = false;
    for (const [stream, tail] of [
      [child.stdout!, tails.stdout],
      [child.stderr!, tails.stderr],
    ] as const) {
      createInterface({ input: stream }).on('line', (line) => {
        if (process.env['SLUICE_UP_VERBOSE'] && echoed(line, echoLevel))
          process.stdout.write(`[${name}] ${line}\n`);
        tail.push(line);
        if (tail.length > TAIL_LINES) tail.shift();
        if (note && started.noted === undefined) {
          const noted = line.match(note);
          if (noted) started.noted = noted;
        }
        if (settled) return;
        const match = line.match(ready);
        if (match) {
          settled = true;
          resolve([started, match]);
        }
      });
    }
    child.once('error', (err) => {
      if (!settled) reject(new Error(`${name}: ${err.message}`));
      settled = true;
    });
    child.once('exit', (code, signal) => {
      // Its last lines may still be in the pipes: read them to the end first.
      void Promise.all([child.stdout!, child.stderr!].map(ended)).then(() => {
        if (!settled)
          reject(
            new Error(
              `${exitLine(name, code, signal)} before it was ready:\n${lastLines().join('\n')}`,
            ),
          );
        settled = true;
      });
    });
  });
}

function ended(stream: NodeJS.ReadableStream): Promise<void> {
  return new Promise((resolve) => {
    if ((stream as { readableEnded?: boolean }).readableEnded) resolve();
    else stream.once('close', () => resolve());
  });
}

function exitLine(name: string, code: number | null, signal: NodeJS.Signals | null): string {
  return `${name} exited (${code === null ? `signal ${signal}` : `code ${code}`})`;
}

const upHelp = `Usage: sluice up

Runs a local stack on this machine as child processes: redis-server (unless REDIS_URL,
REDIS_SENTINELS or REDIS_CLUSTER_NODES is set; port SLUICE_REDIS_PORT, default 6379), the
engine simulator (unless VLLM_URL or SLUICE_CONFIG names the engines; port
SLUICE_ENGINE_PORT, default 8000), two dispatchers (METRICS_PORT and the next) and two
gateways (PORT and the next; GATEWAY_METRICS_PORT, if set, and the next for their
/metrics). Ctrl-C or SIGTERM stops them all, also during start-up. A child that fails is
named with its last lines, and up exits 1; one still not ready is named every 10 s with its
last line. SLUICE_UP_VERBOSE=1 echoes every child's log at LOG_LEVEL and above (the
children themselves log at info at least: up reads their ready lines). See
apps/cli/README.md.
`;

/** A variable as @sluice/config reads it: an empty one is unset. */
function variable(env: NodeJS.ProcessEnv, name: string): string | undefined {
  const value = env[name];
  return value === '' ? undefined : value;
}

/** `base` for the first child and `base + 1` for the second; 0 (pick a free port) for both. */
function twoPorts(value: string): [string, string] {
  // Anything but a port number goes to both as written, so the child's refusal names it.
  if (!/^\d+$/.test(value) || Number(value) === 0) return [value, value];
  return [String(Number(value)), String(Number(value) + 1)];
}

/** What `sluice up` starts, and on which ports, from its environment. */
export interface UpPlan {
  /** redis-server is started: no REDIS_URL, Sentinel or Cluster is named. */
  redis: boolean;
  redisPort: string;
  /**
   * The engine simulator is started: neither VLLM_URL (one engine) nor SLUICE_CONFIG (a pools
   * file, which lists its engines and may not be combined with VLLM_URL) names the engines.
   */
  simulator: boolean;
  enginePort: string;
  gatewayPorts: [string, string];
  metricsPorts: [string, string];
  /** GATEWAY_METRICS_PORT split as PORT is; absent when unset (/metrics on the API port). */
  gatewayMetricsPorts?: [string, string];
  /**
   * The children's LOG_LEVEL, absent to leave it as it is. up knows a child is ready by its
   * info line `... ready`: a level above info (warn, error, fatal, silent) would hide it and
   * up would wait for good, so the children get info and the operator's level only filters
   * what up echoes. A value that is no level goes to them as written, for them to refuse.
   */
  childLogLevel?: string;
  /** The lowest pino level SLUICE_UP_VERBOSE echoes of the children's logs. */
  echoLevel: number;
}

function logLevels(value: string | undefined): Pick<UpPlan, 'childLogLevel' | 'echoLevel'> {
  const info = LEVELS['info']!;
  if (value === undefined) return { echoLevel: info };
  // Not a level: the children refuse it, and up reports the first one that did.
  if (!Object.hasOwn(LEVELS, value)) return { childLogLevel: value, echoLevel: info };
  const level = LEVELS[value]!;
  return level > info
    ? { childLogLevel: 'info', echoLevel: level }
    : { childLogLevel: value, echoLevel: level };
}

export function upPlan(env: NodeJS.ProcessEnv): UpPlan {
  const gatewayMetricsPort = variable(env, 'GATEWAY_METRICS_PORT');
  return {
    redis: !(
      variable(env, 'REDIS_URL') ||
      variable(env, 'REDIS_SENTINELS') ||
      variable(env, 'REDIS_CLUSTER_NODES')
    ),
    redisPort: variable(env, 'SLUICE_REDIS_PORT') ?? '6379',
    simulator: !(variable(env, 'VLLM_URL') || variable(env, 'SLUICE_CONFIG')),
    enginePort: variable(env, 'SLUICE_ENGINE_PORT') ?? '8000',
    gatewayPorts: twoPorts(variable(env, 'PORT') ?? '8080'),
    metricsPorts: twoPorts(variable(env, 'METRICS_PORT') ?? '9464'),
    ...(gatewayMetricsPort === undefined
      ? {}
      : { gatewayMetricsPorts: twoPorts(gatewayMetricsPort) }),
    ...logLevels(variable(env, 'LOG_LEVEL')),
  };
}

/** The engines SLUICE_CONFIG lists, one line each, and a model to try; read as a dispatcher did. */
async function configuredEngines(file: string): Promise<{ lines: string[]; model?: string }> {
  try {
    const { loadConfig } = await import('@sluice/config');
    const { pools } = loadConfig(process.env);
    return {
      lines: pools.flatMap((pool) =>
        pool.engines.map(
          (engine) => `  engine       ${engine.url}  (pool ${pool.name}, from SLUICE_CONFIG)`,
        ),
      ),
      ...(pools[0]?.models[0] === undefined ? {} : { model: pools[0].models[0] }),
    };
  } catch {
    // The dispatchers read the same file a moment ago; if it changed since, say where it is.
    return { lines: [`  engines      as SLUICE_CONFIG=${file} lists them`] };
  }
}

/** A stop (Ctrl-C, SIGTERM) came while the stack was starting: nothing more is started. */
class Stopped extends Error {}

export async function runUp(argv: string[]): Promise<void> {
  if (strictFlags('up', argv, {}).help) {
    process.stdout.write(upHelp);
    return;
  }
  const verbose = !!process.env['SLUICE_UP_VERBOSE'];
  const plan = upPlan(process.env);
  // Every child spawned, ready or still starting: a stop must reach all of them.
  const spawned: Started[] = [];
  let stopping: NodeJS.Signals | undefined;
  const terminate = () => {
    for (const { child } of [...spawned].reverse())
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
  };
  // Installed for good (not `once`): a second signal, while the children are stopping, must
  // not kill up with Node's default action and leave them running without a parent. It is
  // passed on to them, and each child's own second-signal rule applies (none waits longer).
  const onSignal = (signal: NodeJS.Signals) => {
    stopping ??= signal;
    terminate();
  };
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);

  // Never above info: up reads the children's info lines to know they are ready.
  const baseEnv: Record<string, string | undefined> = {
    ...process.env,
    ...(plan.childLogLevel === undefined ? {} : { LOG_LEVEL: plan.childLogLevel }),
  };
  /** Starts one child, unless a stop came; a stop while it starts stops it too (terminate). */
  const start = async (
    name: string,
    command: string,
    args: string[],
    ready: RegExp,
    env: Record<string, string | undefined> = baseEnv,
    note?: RegExp,
  ): Promise<[Started, RegExpMatchArray]> => {
    if (stopping) throw new Stopped();
    let notice: NodeJS.Timeout | undefined;
    const options: ChildOptions = {
      ready,
      env,
      echoLevel: plan.echoLevel,
      ...(note ? { note } : {}),
    };
    try {
      const result = await startChild(name, command, args, options, (started) => {
        spawned.push(started);
        // Where a start hangs (a dispatcher waiting for a Redis that is not there), which child.
        if (verbose)
          process.stdout.write(`sluice up: starting ${name} (pid ${started.child.pid})\n`);
        // No limit on a start (a Redis may come up late), but never a silent wait: every 10 s
        // up names the child it waits for and what it said last.
        let waited = 0;
        notice = setInterval(() => {
          waited += WAIT_NOTICE_MS / 1000;
          const last = started.lastLines().at(-1) ?? '(nothing yet)';
          process.stderr.write(
            `sluice up: still waiting for ${name} (pid ${started.child.pid}) after ${waited} s; its last line: ${last}\n`,
          );
        }, WAIT_NOTICE_MS);
      });
      // Ready just as the stop came: it is stopped with the others, and nothing more starts.
      if (stopping) throw new Stopped();
      return result;
    } catch (err) {
      // Stopped before it was ready: the stop's doing, not a failure.
      if (stopping) throw new Stopped();
      throw err;
    } finally {
      clearInterval(notice);
    }
  };

  try {
    let redisUrl = variable(process.env, 'REDIS_URL');
    if (plan.redis) {
      if (spawnSync('redis-server', ['--version']).error)
        throw new Error(
          'redis-server is not on the PATH: run `npm run setup` (installs it from Debian packages) or set REDIS_URL',
        );
      await start(
        'redis',
        'redis-server',
        ['--port', plan.redisPort, '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'],
        /Ready to accept connections/,
      );
      redisUrl = `redis://127.0.0.1:${plan.redisPort}`;
    }

    // SLUICE_CONFIG lists the engines itself; the configuration refuses VLLM_URL beside it.
    const configFile = variable(process.env, 'SLUICE_CONFIG');
    let engineUrl = variable(process.env, 'VLLM_URL');
    if (plan.simulator) {
      const [, match] = await start(
        'engine-sim',
        process.execPath,
        [cliMain, 'engine-sim', '--port', plan.enginePort],
        /"url":"([^"]+)".*"msg":"engine-sim ready"/,
      );
      engineUrl = match[1]!;
    }

    // The simulator's homelab engine runs --max-num-seqs 4; a real engine's value comes
    // from the operator (VLLM_MAX_NUM_SEQS / ADMISSION_MAX_INFLIGHT, or the pools file).
    const env: Record<string, string | undefined> = {
      ...baseEnv,
      ...(plan.redis ? { REDIS_URL: redisUrl } : {}),
      ...(plan.simulator
        ? {
            VLLM_URL: engineUrl,
            VLLM_MAX_NUM_SEQS: variable(process.env, 'VLLM_MAX_NUM_SEQS') ?? '4',
          }
        : {}),
    };
    const ready = (component: string) => new RegExp(`"url":"([^"]+)".*"msg":"${component} ready"`);
    const dispatchers: string[] = [];
    for (const [i, role] of ['leader', 'standby'].entries()) {
      const [, match] = await start(
        `dispatcher-${i + 1}`,
        process.execPath,
        [cliMain, 'dispatcher'],
        ready('dispatcher'),
        {
          ...env,
          METRICS_PORT: plan.metricsPorts[i],
          SLUICE_DISPATCHER_ID: process.env['SLUICE_DISPATCHER_ID']
            ? `${process.env['SLUICE_DISPATCHER_ID']}-${i + 1}`
            : `dispatcher-${i + 1}`,
        },
      );
      dispatchers.push(`${match[1]!}/status  (${role} at start; /metrics)`);
    }
    const gateways: { url: string; metricsUrl?: string }[] = [];
    for (const i of [0, 1]) {
      const [started, match] = await start(
        `gateway-${i + 1}`,
        process.execPath,
        [cliMain, 'gateway'],
        ready('gateway'),
        {
          ...env,
          PORT: plan.gatewayPorts[i],
          // Each its own /metrics port, as each has its own API port.
          ...(plan.gatewayMetricsPorts
            ? { GATEWAY_METRICS_PORT: plan.gatewayMetricsPorts[i] }
            : {}),
          SLUICE_REPLICA_ID: `gateway-${i + 1}`,
        },
        /"metricsUrl":"([^"]+)".*"msg":"gateway listening"/,
      );
      const metricsUrl = started.noted?.[1];
      gateways.push({ url: match[1]!, ...(metricsUrl === undefined ? {} : { metricsUrl }) });
    }

    const configured = configFile === undefined ? undefined : await configuredEngines(configFile);
    const engines = configured
      ? configured.lines
      : [
          `  engine       ${engineUrl}${plan.simulator ? '  (engine simulator, homelab profile; metrics at /metrics)' : ''}`,
        ];
    process.stdout.write(
      [
        'sluice up: local stack running (Ctrl-C stops it)',
        `  redis        ${redisUrl ?? 'as REDIS_SENTINELS / REDIS_CLUSTER_NODES name it'}`,
        ...(configured ? ['  (no engine simulator: SLUICE_CONFIG lists the engines)'] : []),
        ...engines,
        ...gateways.map(({ url, metricsUrl }) =>
          metricsUrl === undefined
            ? `  gateway      ${url}  (OpenAI API at /v1, /metrics, /readyz)`
            : `  gateway      ${url}  (OpenAI API at /v1, /readyz; metrics at ${metricsUrl}/metrics)`,
        ),
        ...dispatchers.map((url) => `  dispatcher   ${url}`),
        `try: curl ${gateways[0]!.url}/v1/chat/completions -H 'content-type: application/json' -d '{"model":"${configured?.model ?? 'reasoning'}","messages":[{"role":"user","content":"hi"}]}'`,
        '',
      ].join('\n'),
    );
    const first = await Promise.race(
      spawned.map(async (s) => {
        await exited(s.child);
        await Promise.all([s.child.stdout!, s.child.stderr!].map(ended));
        return s;
      }),
    );
    // Ctrl-C stops every child; one that ended by itself failed, and takes the stack down.
    if (!stopping) {
      const { name, child } = first;
      throw new Error(
        `${exitLine(name, child.exitCode, child.signalCode)}; stopping the stack. Its last lines:\n${first.lastLines().join('\n')}`,
      );
    }
  } catch (err) {
    // A stop during start-up ends up as a stop after it does: every child gone, exit 0.
    if (!(err instanceof Stopped)) throw err;
    process.stdout.write(`sluice up: stopped (${stopping}) before the stack was running\n`);
  } finally {
    terminate();
    // Return only once every component is gone, so a supervisor that saw `up` exit can
    // reuse the ports at once.
    await Promise.all(spawned.map(({ child }) => exited(child)));
  }
}
