// `sluice up`: the whole local stack on one machine, as child processes, stopped together.
// Redis comes from the PATH unless REDIS_URL (or a Sentinel or Cluster) is set; the engine
// simulator runs unless VLLM_URL is set. Components that do not exist yet are named, not faked.
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
}

const TAIL_LINES = 10;

/** Spawns a child and resolves with the first output line matching `ready`. */
function startChild(
  name: string,
  command: string,
  args: string[],
  ready: RegExp,
  env: Record<string, string | undefined> = process.env,
): Promise<[Started, RegExpMatchArray]> {
  return new Promise((resolve, reject) => {
    const child = spawn(command, args, { stdio: ['ignore', 'pipe', 'pipe'], env });
    const tails = { stdout: [] as string[], stderr: [] as string[] };
    const lastLines = () => (tails.stderr.length > 0 ? tails.stderr : tails.stdout);
    let settled = false;
    for (const [stream, tail] of [
      [child.stdout!, tails.stdout],
      [child.stderr!, tails.stderr],
    ] as const) {
      createInterface({ input: stream }).on('line', (line) => {
        if (process.env['SLUICE_UP_VERBOSE']) process.stdout.write(`[${name}] ${line}\n`);
        tail.push(line);
        if (tail.length > TAIL_LINES) tail.shift();
        if (settled) return;
        const match = line.match(ready);
        if (match) {
          settled = true;
          resolve([{ name, child, lastLines }, match]);
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
engine simulator (unless VLLM_URL is set; port SLUICE_ENGINE_PORT, default 8000), two
dispatchers (METRICS_PORT and the next) and two gateways (PORT and the next). Ctrl-C stops
them all. A child that fails is named with its last lines, and up exits 1.
SLUICE_UP_VERBOSE=1 echoes every child's log. See apps/cli/README.md.
`;

export async function runUp(argv: string[]): Promise<void> {
  if (strictFlags('up', argv, {}).help) {
    process.stdout.write(upHelp);
    return;
  }
  const started: Started[] = [];
  let stopping = false;
  const stopAll = () => {
    stopping = true;
    for (const { child } of [...started].reverse())
      if (child.exitCode === null) child.kill('SIGTERM');
  };
  process.once('SIGINT', stopAll);
  process.once('SIGTERM', stopAll);

  try {
    let redisUrl = process.env['REDIS_URL'];
    // A Sentinel or Cluster named in the environment is used as it is: no embedded Redis.
    const outside = !!(process.env['REDIS_SENTINELS'] || process.env['REDIS_CLUSTER_NODES']);
    if (!redisUrl && !outside) {
      if (spawnSync('redis-server', ['--version']).error)
        throw new Error(
          'redis-server is not on the PATH: run `npm run setup` (installs it from Debian packages) or set REDIS_URL',
        );
      const port = process.env['SLUICE_REDIS_PORT'] ?? '6379';
      const [redis] = await startChild(
        'redis',
        'redis-server',
        ['--port', port, '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'],
        /Ready to accept connections/,
      );
      started.push(redis);
      redisUrl = `redis://127.0.0.1:${port}`;
    }

    let engineUrl = process.env['VLLM_URL'];
    if (!engineUrl) {
      const port = process.env['SLUICE_ENGINE_PORT'] ?? '8000';
      const [sim, match] = await startChild(
        'engine-sim',
        process.execPath,
        [cliMain, 'engine-sim', '--port', port],
        /"url":"([^"]+)".*"msg":"engine-sim ready"/,
      );
      started.push(sim);
      engineUrl = match[1]!;
    }

    // The simulator's homelab engine runs --max-num-seqs 4; a real engine's value comes
    // from the operator (VLLM_MAX_NUM_SEQS / ADMISSION_MAX_INFLIGHT).
    const env: Record<string, string | undefined> = {
      ...process.env,
      REDIS_URL: outside ? process.env['REDIS_URL'] : redisUrl,
      VLLM_URL: engineUrl,
      VLLM_MAX_NUM_SEQS:
        process.env['VLLM_MAX_NUM_SEQS'] ?? (process.env['VLLM_URL'] ? undefined : '4'),
    };
    const gatewayPort = Number(process.env['PORT'] ?? 8080);
    const metricsPort = Number(process.env['METRICS_PORT'] ?? 9464);
    const ready = (component: string) => new RegExp(`"url":"([^"]+)".*"msg":"${component} ready"`);
    const dispatchers: string[] = [];
    for (const [i, role] of ['leader', 'standby'].entries()) {
      const [child, match] = await startChild(
        `dispatcher-${i + 1}`,
        process.execPath,
        [cliMain, 'dispatcher'],
        ready('dispatcher'),
        {
          ...env,
          METRICS_PORT: String(metricsPort === 0 ? 0 : metricsPort + i),
          SLUICE_DISPATCHER_ID: process.env['SLUICE_DISPATCHER_ID']
            ? `${process.env['SLUICE_DISPATCHER_ID']}-${i + 1}`
            : `dispatcher-${i + 1}`,
        },
      );
      started.push(child);
      dispatchers.push(`${match[1]!}/status  (${role} at start; /metrics)`);
    }
    const gateways: string[] = [];
    for (const i of [0, 1]) {
      const [child, match] = await startChild(
        `gateway-${i + 1}`,
        process.execPath,
        [cliMain, 'gateway'],
        ready('gateway'),
        {
          ...env,
          PORT: String(gatewayPort === 0 ? 0 : gatewayPort + i),
          SLUICE_REPLICA_ID: `gateway-${i + 1}`,
        },
      );
      started.push(child);
      gateways.push(match[1]!);
    }

    process.stdout.write(
      [
        'sluice up: local stack running (Ctrl-C stops it)',
        `  redis        ${redisUrl}`,
        `  engine       ${engineUrl}${process.env['VLLM_URL'] ? '' : '  (engine simulator, homelab profile; metrics at /metrics)'}`,
        ...gateways.map((url) => `  gateway      ${url}  (OpenAI API at /v1, /metrics, /readyz)`),
        ...dispatchers.map((url) => `  dispatcher   ${url}`),
        `try: curl ${gateways[0]}/v1/chat/completions -H 'content-type: application/json' -d '{"model":"reasoning","messages":[{"role":"user","content":"hi"}]}'`,
        '',
      ].join('\n'),
    );
    const first = await Promise.race(
      started.map(async (s) => {
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
  } finally {
    stopAll();
    // Return only once every component is gone, so a supervisor that saw `up` exit can
    // reuse the ports at once.
    await Promise.all(started.map(({ child }) => exited(child)));
  }
}
