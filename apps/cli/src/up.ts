// `sluice up`: the whole local stack on one machine, as child processes, stopped together.
// Redis comes from the PATH unless REDIS_URL (or a Sentinel or Cluster) is set; the engine
// simulator runs unless VLLM_URL is set. Components that do not exist yet are named, not faked.
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';

const cliMain = fileURLToPath(new URL('./main.js', import.meta.url));

function exited(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
  return new Promise((resolve) => child.once('exit', () => resolve()));
}

interface Started {
  name: string;
  child: ChildProcess;
}

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
    const tail: string[] = [];
    let settled = false;
    for (const stream of [child.stdout!, child.stderr!]) {
      createInterface({ input: stream }).on('line', (line) => {
        if (process.env['SLUICE_UP_VERBOSE']) process.stdout.write(`[${name}] ${line}\n`);
        if (settled) return;
        tail.push(line);
        const match = line.match(ready);
        if (match) {
          settled = true;
          resolve([{ name, child }, match]);
        }
      });
    }
    child.once('error', (err) => {
      if (!settled) reject(new Error(`${name}: ${err.message}`));
      settled = true;
    });
    child.once('exit', (code, signal) => {
      if (!settled)
        reject(
          new Error(
            `${name} exited (${code ?? signal}) before it was ready:\n${tail.slice(-10).join('\n')}`,
          ),
        );
      settled = true;
    });
  });
}

export async function runUp(argv: string[]): Promise<void> {
  if (argv.length > 0)
    throw new Error(`up takes no arguments (configure it with the environment; see README)`);
  const started: Started[] = [];
  const stopAll = () => {
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
      dispatchers.push(`${match[1]!}/metrics  (${role} at start)`);
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
    await Promise.race(started.map(({ child }) => exited(child)));
  } finally {
    stopAll();
    // Return only once every component is gone, so a supervisor that saw `up` exit can
    // reuse the ports at once.
    await Promise.all(started.map(({ child }) => exited(child)));
  }
}
