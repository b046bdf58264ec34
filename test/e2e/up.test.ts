// `sluice up` stopped while it starts, stopped twice, and run on a pools file. A child that is
// not ready is named every 10 s; a stop during start-up reaches the child being started and
// starts nothing more; a second signal is passed
// on to the children still stopping instead of killing up and leaving them without a parent;
// with SLUICE_CONFIG the file names the engines, so up starts no simulator and adds no
// VLLM_URL (which the configuration refuses beside a pools file). A LOG_LEVEL above info
// does not hide the children's ready lines from up, and GATEWAY_METRICS_PORT is split
// between the two gateways as PORT is.
import { createServer, type Server } from 'node:net';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import {
  chat,
  freePort,
  readAll,
  sluiceBin,
  startEngineSim,
  startProcess,
  startRedis,
  type StartedProcess,
  stoppedAfterEach,
} from '../support/index.ts';

const cleanup = stoppedAfterEach();

/** `sluice up` with the children's logs echoed and its own start lines, on free ports. */
async function up(env: Record<string, string>, ready: RegExp): Promise<StartedProcess> {
  const proc = await startProcess({
    command: process.execPath,
    args: [sluiceBin, 'up'],
    env: {
      HOST: '127.0.0.1',
      LOG_LEVEL: 'info',
      PORT: '0',
      METRICS_PORT: '0',
      SLUICE_ENGINE_PORT: '0',
      SLUICE_REDIS_PORT: String(await freePort()),
      REDIS_URL: '',
      VLLM_URL: '',
      SLUICE_CONFIG: '',
      SLUICE_UP_VERBOSE: '1',
      ...env,
    },
    ready,
    // Several processes start one after another: a ceiling for a loaded machine, not a speed.
    timeoutMs: 50_000,
  });
  cleanup.push(proc);
  return proc;
}

/** The children up said it started (SLUICE_UP_VERBOSE), in order. */
function startedChildren(proc: StartedProcess): { name: string; pid: number }[] {
  return proc.output.flatMap((line) => {
    const m = /^sluice up: starting (\S+) \(pid (\d+)\)$/.exec(line);
    return m ? [{ name: m[1]!, pid: Number(m[2]) }] : [];
  });
}

/** Two consecutive ports that were free a moment ago on 127.0.0.1. */
async function freePortPair(): Promise<number> {
  const listen = (port: number) =>
    new Promise<Server | undefined>((resolve) => {
      const server = createServer();
      server.once('error', () => resolve(undefined));
      server.listen(port, '127.0.0.1', () => resolve(server));
    });
  const close = (server: Server | undefined) =>
    new Promise<void>((resolve) => (server ? server.close(() => resolve()) : resolve()));
  for (;;) {
    const first = await freePort();
    if (first >= 65535) continue;
    const [a, b] = await Promise.all([listen(first), listen(first + 1)]);
    await Promise.all([close(a), close(b)]);
    if (a && b) return first;
  }
}

/** Whether a process with this pid exists (signal 0 checks without sending anything). */
function exists(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ESRCH') return false;
    throw err;
  }
}

describe('sluice up stopped', () => {
  it('during start-up: stops the child being started, starts nothing more, exits 0 with no child left', async () => {
    // Nothing listens there: dispatcher-1 waits for Redis and never becomes ready.
    const proc = await up(
      { REDIS_URL: `redis://127.0.0.1:${await freePort()}` },
      /^sluice up: starting dispatcher-1 \(pid \d+\)$/,
    );
    const children = startedChildren(proc);
    expect(children.map((c) => c.name)).toEqual(['engine-sim', 'dispatcher-1']);
    // Not a silent wait: up names the child it is still waiting for, with its last line.
    const notice = await proc.waitForLine(
      /^sluice up: still waiting for dispatcher-1 \(pid (\d+)\) after 10 s; its last line: (.+)$/,
      60_000,
    );
    expect(Number(notice[1])).toBe(children[1]!.pid);

    proc.child.kill('SIGTERM');
    const { code, signal } = await proc.closed;
    expect({ code, signal }).toEqual({ code: 0, signal: null });
    expect(proc.output).toContain('sluice up: stopped (SIGTERM) before the stack was running');
    expect(startedChildren(proc)).toEqual(children);
    // up returns only once its children are gone (and reaped), the one being started too.
    expect(children.filter((c) => exists(c.pid))).toEqual([]);
  }, 120_000);

  it('twice: the second signal reaches the children still stopping, and up still outlives them', async () => {
    const redis = await startRedis();
    cleanup.push(redis);
    // A step per second: the stream below outlasts the test unless something cuts it.
    const sim = await startEngineSim(['--model', 'm', '--step-overhead-seconds', '1']);
    cleanup.push(sim);
    const proc = await up(
      // The first signal alone leaves gateway-1 serving its held stream for ten minutes.
      { REDIS_URL: redis.url, VLLM_URL: sim.url, SLUICE_SHUTDOWN_DRAIN_SECONDS: '600' },
      /^try: curl/,
    );
    const children = startedChildren(proc);
    expect(children.map((c) => c.name)).toEqual([
      'dispatcher-1',
      'dispatcher-2',
      'gateway-1',
      'gateway-2',
    ]);
    const gateway = /^ {2}gateway +(http:\S+)/m.exec(proc.output.join('\n'))![1]!;
    const res = await chat(gateway, 'held', { stream: true, max_tokens: 5000, ignore_eos: true });
    expect(res.status).toBe(200);
    // The answer's head is out: gateway-1 holds this client and drains it on SIGTERM.
    const answer = readAll(res);

    proc.child.kill('SIGTERM');
    await proc.waitForLine(/^\[gateway-1\] .*"held":1.*"msg":"gateway draining"/);
    // Draining its held stream for ten minutes: only the second signal ends it.
    proc.child.kill('SIGTERM');
    const { code, signal } = await proc.closed;
    expect({ code, signal }).toEqual({ code: 0, signal: null });
    expect(children.filter((c) => exists(c.pid))).toEqual([]);
    // Cut short by the second signal, and told so in the stream.
    expect(await answer).toMatch(/shutting_down/);
  }, 120_000);
});

describe('sluice up with SLUICE_CONFIG', () => {
  it('starts no simulator, serves through the engines the file lists, and says so', async () => {
    const sim = await startEngineSim(['--profile', 'instant', '--model', 'm']);
    cleanup.push(sim);
    const dir = await mkdtemp(join(tmpdir(), 'sluice-up-'));
    cleanup.push({ stop: () => rm(dir, { recursive: true, force: true }) });
    const file = join(dir, 'pools.yaml');
    await writeFile(
      file,
      [
        'pools:',
        '  - name: chat',
        '    models: [m]',
        '    engines:',
        `      - { url: "${sim.url}", maxInflight: 2 }`,
        '',
      ].join('\n'),
    );
    const proc = await up({ SLUICE_CONFIG: file }, /^try: curl/);
    const printed = proc.output.filter((l) => !l.startsWith('[')).join('\n');
    expect(printed).toContain('sluice up: local stack running');
    expect(printed).toContain('  (no engine simulator: SLUICE_CONFIG lists the engines)');
    expect(printed).toContain(`  engine       ${sim.url}  (pool chat, from SLUICE_CONFIG)`);
    expect(printed).toContain(`"model":"m"`);
    expect(startedChildren(proc).map((c) => c.name)).toEqual([
      'redis',
      'dispatcher-1',
      'dispatcher-2',
      'gateway-1',
      'gateway-2',
    ]);

    const gateway = /^ {2}gateway +(http:\S+)/m.exec(printed)![1]!;
    const res = await chat(gateway, 'hi', { max_tokens: 2 });
    expect(res.status).toBe(200);
    expect(res.headers.get('x-sluice-engine')).toBe(new URL(sim.url).host);
    await res.text();
  }, 120_000);
});

describe('sluice up with the operator settings the children share', () => {
  it('starts at LOG_LEVEL=warn, and echoes only warn and above of the children logs', async () => {
    // The children's ready lines are info: at warn up used to wait for them for good.
    const proc = await up({ LOG_LEVEL: 'warn' }, /^try: curl/);
    expect(startedChildren(proc).map((c) => c.name)).toEqual([
      'redis',
      'engine-sim',
      'dispatcher-1',
      'dispatcher-2',
      'gateway-1',
      'gateway-2',
    ]);
    // SLUICE_UP_VERBOSE echoes what the operator asked for, not the info lines up reads.
    const echoedLevels = proc.output.flatMap((line) => {
      const m = /^\[[\w-]+\] \{"level":(\d+),/.exec(line);
      return m ? [Number(m[1])] : [];
    });
    expect(echoedLevels.filter((level) => level < 40)).toEqual([]);
    // The stack serves: the model up suggests (the simulator's), through gateway-1.
    const printed = proc.output.join('\n');
    const gateway = /^ {2}gateway +(http:\S+)/m.exec(printed)![1]!;
    const model = /^try: curl .*"model":"([^"]+)"/m.exec(printed)![1]!;
    const res = await chat(gateway, 'hi', { model, max_tokens: 2 });
    expect(res.status).toBe(200);
    await res.text();
  }, 120_000);

  it('gives each gateway its own GATEWAY_METRICS_PORT, the given port and the next', async () => {
    // Both on the same port, gateway-2 exited "address already in use" and took up down.
    const port = await freePortPair();
    const proc = await up({ GATEWAY_METRICS_PORT: String(port) }, /^try: curl/);
    const printed = proc.output.filter((l) => !l.startsWith('[')).join('\n');
    const metricsUrls = [
      ...printed.matchAll(/^ {2}gateway +http:\S+ .*metrics at (http:\S+)\)$/gm),
    ].map((m) => m[1]!);
    expect(metricsUrls).toEqual([
      `http://127.0.0.1:${port}/metrics`,
      `http://127.0.0.1:${port + 1}/metrics`,
    ]);
    for (const url of metricsUrls) {
      const res = await fetch(url);
      expect(res.status, url).toBe(200);
      expect(await res.text(), url).toMatch(/^sluice_/m);
    }
  }, 120_000);
});
