// Overhead: what Sluice adds to every request. Client -> engine straight, against client ->
// gateway -> Redis -> dispatcher -> engine -> gateway, on the `instant` simulator (no model
// latency), so the difference is the broker's own cost on this machine.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { performance } from 'node:perf_hooks';
import { QUEUE_EVENTS_MAX_LEN } from '@sluice/protocol';
import { Redis } from 'ioredis';
import { Agent, request } from 'undici';
import { afterAll, beforeAll, expect, it } from 'vitest';
import {
  eventually,
  startDispatcher,
  startGateway,
  startStack,
  type SluiceProcess,
  type Stack,
  type TestEngineSim,
  type TestRedis,
  untilReady,
} from '../support/index.ts';
import {
  cpuSeconds,
  round,
  summarize,
  writeResult,
  type Figure,
  type ScenarioResult,
} from './results.ts';
import { breakdown, criticalPath, readMarks, type Mark } from './stages.ts';
import { bullmqFloor } from './bullmq-floor.ts';

/** The part of autocannon's API used here (the package ships no types). */
type Autocannon = (
  options: {
    url: string;
    method: 'POST';
    headers: Record<string, string>;
    body: string;
    connections: number;
    duration: number;
  },
  done: (err: Error | null, result: { errors: number; timeouts: number; non2xx: number }) => void,
) => {
  on(event: 'response', listener: (...args: [unknown, number, number, number]) => void): void;
};
const autocannon = createRequire(import.meta.url)('autocannon') as Autocannon;

const WARMUP = 100;
/**
 * Requests per run one at a time. A run's p99 is its tenth-slowest request here; with 300 (until
 * December 2026) it was the third-slowest, and one pause more or less moved it by milliseconds.
 */
const REQUESTS = 1000;
const RUNS = 3;
/** Closed-loop concurrency steps of the sustained-load part, and seconds per step. */
const CONNECTIONS = [1, 2, 4, 6, 8, 12, 16, 32, 64];
/** The steps of the two-tenant run. */
const TENANT_CONNECTIONS = [16, 32];
const STEP_SECONDS = 3;
/**
 * Rounds of each step, direct and Sluice alternating, whose median makes the step's figures.
 * A step's p99 is its thirtieth-slowest request or so at 1,000 req/s: one stall of this shared
 * machine (docs/performance.md) moved a single round's added p99 by several ms, and the
 * highest rate under the limit between 454 and 1,300 req/s from run to run on unchanged code.
 */
const ROUNDS = 3;
const ADDED_P99_LIMIT_MS = 10;
/** The whole scenario: three rounds of nine load steps on both paths make most of its ~4 min. */
const SCENARIO_TIMEOUT_MS = 600_000;
/** The throughput goals (issue #14): non-streaming, instant engine, on this 2-core machine. */
const RATE_GOALS: Partial<Record<number, number>> = { 16: 1500, 32: 2000 };
/** Per request: Redis commands, and CPU of gateway + dispatcher + Redis (ms). */
const COMMANDS_GOAL = 40;
const CPU_GOAL_MS = 0.8;

const headers = { 'content-type': 'application/json' };
const chat = (stream: boolean) =>
  JSON.stringify({
    model: 'm',
    messages: [{ role: 'user', content: 'Say hello.' }],
    max_tokens: 16,
    stream,
  });

let stack: Stack;
let redis: TestRedis;
let sim: TestEngineSim;
/** The stack's dispatcher and gateway, until the breakdown restarts both with its recorder. */
let dispatcher: SluiceProcess;
let gateway: SluiceProcess;
const agent = new Agent({ connections: 1 });
let env: Record<string, string>;

beforeAll(async () => {
  // LOG_LEVEL stays at the harness's `info`: the harness waits for the info-level ready line.
  // On the request path only the gateway's access log writes at info, as it does by default.
  stack = await startStack({
    keepGatewayOutput: false,
    env: { ADMISSION_MAX_INFLIGHT: '64', VLLM_MAX_QUEUE_DEPTH: '100000' },
  });
  ({ redis, sim, dispatcher, gateway, env } = stack);
});

afterAll(async () => {
  await agent.close();
  await Promise.all([gateway?.stop(), dispatcher?.stop()]);
  await stack?.stop();
});

/**
 * One request, in ms: until the whole body for a plain request, until the first body byte for
 * a stream (whose rest is read before the next request starts).
 */
async function once(url: string, stream: boolean): Promise<number> {
  const start = performance.now();
  const res = await request(`${url}/v1/chat/completions`, {
    method: 'POST',
    headers,
    body: chat(stream),
    dispatcher: agent,
  });
  if (res.statusCode !== 200) throw new Error(`${url}: HTTP ${res.statusCode}`);
  if (!stream) {
    await res.body.text();
    return performance.now() - start;
  }
  let firstByte: number | undefined;
  let text = '';
  for await (const chunk of res.body) {
    firstByte ??= performance.now() - start;
    text += String(chunk);
  }
  if (!text.endsWith('data: [DONE]\n\n')) throw new Error(`${url}: stream ended early`);
  return firstByte!;
}

/** `n` requests one at a time, alternating direct and Sluice so that both see the same machine. */
async function alternate(n: number, stream: boolean) {
  const direct: number[] = [];
  const sluice: number[] = [];
  for (let i = 0; i < n; i += 1) {
    direct.push(await once(sim.url, stream));
    sluice.push(await once(gateway.url, stream));
  }
  return { direct: summarize(direct), sluice: summarize(sluice) };
}

type Step = Awaited<ReturnType<typeof load>>;
type Runs = NonNullable<ScenarioResult['runs']>;

/**
 * The median of one figure over repeated runs or rounds; with `spread`, its lowest, median and
 * highest go into the result's `runs` (the report's "Noise of repeated runs").
 */
function medianOf(values: number[], spread?: { runs: Runs; of: string; unit: string }): number {
  const s = summarize(values);
  spread?.runs.push({
    n: values.length,
    min: round(s.min),
    median: round(s.median),
    max: round(s.max),
    unit: spread.unit,
    of: spread.of,
  });
  return s.median;
}

/** One closed-loop autocannon step: achieved requests/s, latency p99 in ms, failures. */
function load(url: string, connections: number, bearer?: string) {
  return new Promise<{ rate: number; p99: number; failed: number }>((resolve, reject) => {
    const latencies: number[] = [];
    const run = autocannon(
      {
        url: `${url}/v1/chat/completions`,
        method: 'POST',
        headers: bearer ? { ...headers, authorization: `Bearer ${bearer}` } : headers,
        body: chat(false),
        connections,
        duration: STEP_SECONDS,
      },
      (err, result) => {
        if (err) return reject(err);
        resolve({
          rate: latencies.length / STEP_SECONDS,
          p99: summarize(latencies).p99,
          failed: result.errors + result.timeouts + result.non2xx,
        });
      },
    );
    // autocannon's histogram has 1 ms resolution; the time it reports per response is exact.
    run.on('response', (_client, _status, _bytes, ms) => latencies.push(ms));
  });
}

/** Calls per Redis command so far, from INFO commandstats. */
async function redisCalls(client: Redis): Promise<Map<string, number>> {
  const info = await client.info('commandstats');
  const calls = new Map<string, number>();
  for (const m of info.matchAll(/^cmdstat_([^:]+):calls=(\d+)/gm)) calls.set(m[1]!, Number(m[2]));
  return calls;
}

async function oneAtATime(figures: Figure[], runs: Runs) {
  for (const stream of [false, true]) {
    const mode = stream ? 'streaming, time to first byte' : 'non-streaming';
    await alternate(WARMUP, stream);
    const each: Awaited<ReturnType<typeof alternate>>[] = [];
    for (let r = 0; r < RUNS; r += 1) each.push(await alternate(REQUESTS, stream));
    const across = (of: string, pick: (run: (typeof each)[number]) => number, noise = true) =>
      medianOf(each.map(pick), noise ? { runs, of: `${of}, ${mode}`, unit: 'ms' } : undefined);
    const direct50 = across('direct p50', (run) => run.direct.p50);
    const sluice50 = across('Sluice p50', (run) => run.sluice.p50);
    const added50 = across('added p50', (run) => run.sluice.p50 - run.direct.p50);
    const direct99 = across('direct p99', (run) => run.direct.p99, false);
    const sluice99 = across('Sluice p99', (run) => run.sluice.p99, false);
    const added99 = across('added p99', (run) => run.sluice.p99 - run.direct.p99, false);
    const ms = (name: string, value: number, goal?: [string, number]): Figure => ({
      name: `${name}, one at a time, ${mode}`,
      value: round(value),
      unit: 'ms',
      ...(goal && { goal: goal[0], met: value <= goal[1] }),
    });
    figures.push(
      ms('direct p50', direct50),
      ms('direct p99', direct99),
      ms('Sluice p50', sluice50),
      ms('Sluice p99', sluice99),
      ms('added p50', added50, ['added p50 <= 3 ms', 3]),
      ms('added p99', added99, ['added p99 <= 8 ms', 8]),
    );
  }
}

async function sustained(figures: Figure[], notes: string[], runs: Runs) {
  const client = new Redis(redis.url);
  const pids = {
    gateway: gateway.process.child.pid!,
    dispatcher: dispatcher.process.child.pid!,
    engine: sim.process.child.pid!,
    redis: redis.process.child.pid!,
  };
  const cpu = () => Object.values(pids).map(cpuSeconds);
  const used = Object.keys(pids).map(() => 0);
  const before = await redisCalls(client);
  let requests = 0;
  let sustainedRate = 0;
  const peak = { direct: 0, sluice: 0 };
  let passed = true;
  // The engine stands in for the GPU: the broker's own cost is the other three processes.
  const broker = Object.keys(pids).map((name) => name !== 'engine');
  for (const connections of CONNECTIONS) {
    const rounds: { direct: Step; sluice: Step }[] = [];
    let stepCpu = 0;
    let stepRequests = 0;
    for (let r = 0; r < ROUNDS; r += 1) {
      const direct = await load(sim.url, connections);
      const start = cpu();
      const sluice = await load(gateway.url, connections);
      cpu().forEach((s, i) => {
        used[i]! += s - start[i]!;
        if (broker[i]) stepCpu += s - start[i]!;
      });
      requests += sluice.rate * STEP_SECONDS;
      stepRequests += sluice.rate * STEP_SECONDS;
      expect(direct.failed + sluice.failed, 'failed requests').toBe(0);
      rounds.push({ direct, sluice });
    }
    const at = `${connections} connection${connections > 1 ? 's' : ''}`;
    const across = (of: string, unit: string, pick: (round: (typeof rounds)[number]) => number) =>
      medianOf(rounds.map(pick), { runs, of: `${of}, ${at}`, unit });
    const directRate = medianOf(rounds.map((r) => r.direct.rate));
    const sluiceRate = across('Sluice rate', 'req/s', (r) => r.sluice.rate);
    const added = across('added p99', 'ms', (r) => r.sluice.p99 - r.direct.p99);
    peak.direct = Math.max(peak.direct, directRate);
    peak.sluice = Math.max(peak.sluice, sluiceRate);
    passed &&= added <= ADDED_P99_LIMIT_MS;
    if (passed) sustainedRate = sluiceRate;
    figures.push(
      { name: `direct rate, ${at}`, value: round(directRate, 0), unit: 'req/s' },
      {
        name: `Sluice rate, ${at}`,
        value: round(sluiceRate, 0),
        unit: 'req/s',
        ...(RATE_GOALS[connections] !== undefined && {
          goal: `>= ${RATE_GOALS[connections]!.toLocaleString('en')} req/s`,
          met: sluiceRate >= RATE_GOALS[connections]!,
        }),
      },
      {
        name: `direct p99, ${at}`,
        value: round(medianOf(rounds.map((r) => r.direct.p99))),
        unit: 'ms',
      },
      {
        name: `Sluice p99, ${at}`,
        value: round(medianOf(rounds.map((r) => r.sluice.p99))),
        unit: 'ms',
      },
      { name: `added p99, ${at}`, value: round(added), unit: 'ms' },
      {
        // Per step, since it falls with concurrency: at one or two connections every process
        // wakes from idle for each request; a saturated dispatcher costs what the top steps say.
        name: `CPU per Sluice request, ${at}: gateway + dispatcher + Redis`,
        value: round((stepCpu / stepRequests) * 1000),
        unit: 'ms',
      },
    );
  }
  figures.push({
    name: `highest Sluice rate with added p99 <= ${ADDED_P99_LIMIT_MS} ms`,
    value: round(sustainedRate, 0),
    unit: 'req/s',
    goal: '>= 1,000 req/s',
    met: sustainedRate >= 1000,
    ...(sustainedRate === 0 && { note: 'added p99 was above the limit from the first step' }),
  });
  figures.push(
    { name: 'highest direct rate, any latency', value: round(peak.direct, 0), unit: 'req/s' },
    { name: 'highest Sluice rate, any latency', value: round(peak.sluice, 0), unit: 'req/s' },
  );
  Object.keys(pids).forEach((name, i) =>
    figures.push({
      name: `CPU per Sluice request under load: ${name}`,
      value: round((used[i]! / requests) * 1000),
      unit: 'ms',
    }),
  );
  const brokerCpuMs = used.reduce(
    (sum, u, i) => (broker[i] ? sum + (u / requests) * 1000 : sum),
    0,
  );
  figures.push({
    name: 'CPU per Sluice request under load: gateway + dispatcher + Redis',
    value: round(brokerCpuMs),
    unit: 'ms',
    goal: `<= ${CPU_GOAL_MS} ms`,
    met: brokerCpuMs <= CPU_GOAL_MS,
  });
  const after = await redisCalls(client);
  await client.quit();
  const delta = [...after].map(
    ([cmd, n]) => [cmd, (n - (before.get(cmd) ?? 0)) / requests] as const,
  );
  const perRequest = delta.reduce((sum, [, n]) => sum + n, 0);
  figures.push({
    name: 'Redis commands per Sluice request',
    value: round(perRequest, 1),
    unit: 'commands',
    goal: `<= ${COMMANDS_GOAL}`,
    met: perRequest <= COMMANDS_GOAL,
  });
  const floor = await bullmqFloor();
  const quiet = await bullmqFloor(1000, true);
  figures.push({
    name: "BullMQ's own commands per job (add, then take and complete with fetchNext)",
    value: round(floor.add + floor.run, 1),
    unit: 'commands',
    note: `add ${round(floor.add, 1)}, take and complete ${round(floor.run, 1)}; BullMQ alone on a fresh Redis, every job handed over`,
  });
  figures.push({
    name: "BullMQ's commands per job as Sluice runs its scripts (no events stream)",
    value: round(quiet.add + quiet.run, 1),
    unit: 'commands',
    note: `add ${round(quiet.add, 1)}, take and complete ${round(quiet.run, 1)}; the same queue, the scripts quieted as in Sluice`,
  });
  notes.push(
    `BullMQ alone, on a fresh Redis with a pool's queue settings (global concurrency, events stream at ${QUEUE_EVENTS_MAX_LEN}, prioritised jobs removed on completion), runs ${round(floor.add + floor.run, 1)} commands per job (add ${round(floor.add, 1)}, take and complete with fetchNext ${round(floor.run, 1)}); run as Sluice runs them, without the events stream nobody reads and the add's id counter, ${round(quiet.add + quiet.run, 1)} (add ${round(quiet.add, 1)}, take and complete ${round(quiet.run, 1)}): the floor under the commands goal, before any of Sluice's own.`,
  );
  notes.push(
    `Redis commands per Sluice request (including those BullMQ's Lua scripts run, and the broker's background work during the steps), by command: ${delta
      .filter(([, n]) => n >= 0.05)
      .sort((a, b) => b[1] - a[1])
      .map(([cmd, n]) => `${cmd} ${n.toFixed(1)}`)
      .join(', ')}.`,
  );
}

/**
 * What one round trip costs on this machine, with no Sluice code in it: Redis PINGs back to
 * back, and after the client slept for 2 ms, as the processes on Sluice's path do between one
 * request's hops. The difference is the price of waking a process.
 */
async function roundTrips(figures: Figure[]) {
  const client = new Redis(redis.url);
  const time = async (idleMs: number) => {
    const ms: number[] = [];
    for (let i = 0; i < 1300; i += 1) {
      if (idleMs > 0) await new Promise((resolve) => setTimeout(resolve, idleMs));
      const start = performance.now();
      await client.ping();
      if (i >= 300) ms.push(performance.now() - start);
    }
    return summarize(ms).p50;
  };
  const busy = await time(0);
  const idle = await time(2);
  await client.quit();
  figures.push(
    { name: 'Redis PING round trip, back to back (p50)', value: round(busy), unit: 'ms' },
    { name: 'Redis PING round trip, after 2 ms idle (p50)', value: round(idle), unit: 'ms' },
  );
  return { busy, idle };
}

const recorder = fileURLToPath(new URL('./stage-recorder.mjs', import.meta.url));
const BREAKDOWN_REQUESTS = 300;

/**
 * Where the time of one non-streaming request goes: the gateway and dispatcher are restarted
 * with the stage recorder loaded, requests run one at a time (alternating with direct ones, as
 * above), and every stage's median time after the client's send is tabled.
 */
/**
 * The same load in a pool with two tenants (the fair share picks before every take and
 * handover), each tenant on half the connections: the rate a keyed deployment gets.
 */
async function withTenants(figures: Figure[], notes: string[]) {
  const dir = mkdtempSync(join(tmpdir(), 'sluice-overhead-tenants-'));
  const keys = ['sk-overhead-alpha-0123456789abcd', 'sk-overhead-beta-0123456789abcde'];
  const config = join(dir, 'sluice.yaml');
  writeFileSync(
    config,
    [
      'tenants:',
      ...keys.flatMap((key, i) => [`  - name: t${i}`, `    apiKeys: [${key}]`]),
      'pools:',
      '  - name: keyed',
      '    models: [m]',
      '    queueDepth: 100000',
      '    engines:',
      `      - { url: "${sim.url}", name: e, maxInflight: 64 }`,
      '',
    ].join('\n'),
  );
  const keyed = { REDIS_URL: redis.url, SLUICE_CONFIG: config };
  dispatcher = await startDispatcher(keyed);
  gateway = await startGateway(keyed, { keepOutput: false });
  try {
    await untilReady(gateway);
    await Promise.all(keys.map((key) => load(gateway.url, 4, key)));
    for (const connections of TENANT_CONNECTIONS) {
      const steps = await Promise.all(keys.map((key) => load(gateway.url, connections / 2, key)));
      expect(
        steps.reduce((n, s) => n + s.failed, 0),
        'failed requests',
      ).toBe(0);
      figures.push({
        name: `Sluice rate, ${connections} connections, two tenants`,
        value: round(
          steps.reduce((n, s) => n + s.rate, 0),
          0,
        ),
        unit: 'req/s',
      });
    }
  } finally {
    await Promise.all([gateway.stop(), dispatcher.stop()]);
    rmSync(dir, { recursive: true, force: true });
  }
  notes.push(
    `Two tenants: a pool with two API-keyed tenants of equal weight, each on half the connections (${TENANT_CONNECTIONS.join(', ')} in all), ${STEP_SECONDS} s each after a warm-up; the fair share picks before every take and every handover.`,
  );
}

async function whereTheTimeGoes(result: ScenarioResult) {
  const ping = await roundTrips(result.figures);
  await Promise.all([gateway.stop(), dispatcher.stop()]);
  const dir = mkdtempSync(join(tmpdir(), 'sluice-stages-'));
  const traced = {
    ...env,
    NODE_OPTIONS: `--import=${recorder}`,
    SLUICE_STAGE_FILE: join(dir, 'stages'),
  };
  dispatcher = await startDispatcher(traced);
  gateway = await startGateway(traced, { keepOutput: false });
  await eventually(
    () =>
      once(gateway.url, false).then(
        () => true,
        () => undefined,
      ),
    'the restarted dispatcher to lead the pool',
  );
  for (let i = 0; i < WARMUP; i += 1) await once(gateway.url, false);
  const client: Mark[] = [];
  const direct: number[] = [];
  for (let i = 0; i < BREAKDOWN_REQUESTS; i += 1) {
    direct.push(await once(sim.url, false));
    client.push({ at: process.hrtime.bigint(), stage: 'client.send' });
    await once(gateway.url, false);
    client.push({ at: process.hrtime.bigint(), stage: 'client.done' });
  }
  await Promise.all([gateway.stop(), dispatcher.stop()]);
  const marks = [...readMarks(dir, 'stages'), ...client];
  rmSync(dir, { recursive: true, force: true });
  const { rows, requests } = breakdown(marks);
  const at = (stage: string) => rows.find((r) => r.stage === stage)?.fromSend ?? Number.NaN;
  const total = at('client.done');
  const directMedian = summarize(direct).p50;
  result.tables = [
    {
      title: `Where the time goes: ${requests} non-streaming requests one at a time, medians (direct to the engine in the same run: ${round(directMedian)} ms)`,
      head: [
        'Stage',
        'ms after send',
        'Measured from',
        'In between',
        'Hops',
        'Gap (ms)',
        'Gap p99 (ms)',
        'Path',
      ],
      rows: rows.map((r) => [
        r.stage,
        String(round(r.fromSend)),
        r.from,
        r.spans,
        String(r.hops),
        String(round(r.gap)),
        String(round(r.gapP99)),
        r.critical ? 'critical' : 'beside',
      ]),
    },
  ];
  const path = criticalPath(rows);
  const hopGaps = rows.filter((r) => r.critical && r.hops > 0).map((r) => r.gap / r.hops);
  const cpuOf = (name: string) =>
    result.figures.find((f) => f.name === `CPU per Sluice request under load: ${name}`)?.value;
  result.figures.push(
    { name: 'breakdown: critical-path hops between processes', value: path.hops, unit: 'hops' },
    { name: 'breakdown: time in those hops (median)', value: round(path.hopMs), unit: 'ms' },
    {
      name: 'breakdown: time in work inside one process (median)',
      value: round(path.workMs),
      unit: 'ms',
    },
  );
  result.bottleneck = [
    `Hops between processes, not the work inside any of them.`,
    `One request at a time, Sluice took ${round(total, 2)} ms (median) against ${round(directMedian, 2)} ms direct.`,
    `Its critical path crosses processes ${path.hops} times (client, gateway, Redis, dispatcher, Redis, dispatcher, engine, dispatcher, Redis, gateway, client), where a direct request crosses twice;`,
    `those gaps take ${round(path.hopMs, 2)} ms, ${round(Math.min(...hopGaps), 2)} to ${round(Math.max(...hopGaps), 2)} ms per hop on this machine; a bare Redis PING round trip takes ${round(ping.busy, 2)} ms back to back and ${round(ping.idle, 2)} ms from a process that slept 2 ms, so most of a hop is the libraries' work at both ends (HTTP in Fastify and undici, commands, Lua scripts and replies in ioredis, BullMQ and Redis, pub/sub delivery) in processes woken from idle, while Sluice's own steps between hops take ${round(path.workMs, 2)} ms in all (the stage table of the overhead section in report.md).`,
    `The design's floor is one Redis round trip to enqueue, two for BullMQ to hand the job over (the marker wakes the dispatcher's blocking read, then the move to active), and one pub/sub hop back; fewer would mean leaving BullMQ's queue or the single dispatcher that makes the cap exact.`,
    `Under load the same chain is CPU: ${cpuOf('gateway')} ms in the gateway, ${cpuOf('dispatcher')} ms in the dispatcher and ${cpuOf('redis')} ms in Redis per request (the overhead figures), which is what caps the rate on two shared cores.`,
  ].join(' ');
}

it(
  'measures the latency Sluice adds, one request at a time and under sustained load',
  async () => {
    const figures: Figure[] = [];
    const runs: Runs = [];
    const notes = [
      `One at a time: ${WARMUP} warm-up requests, then ${RUNS} runs of ${REQUESTS} requests alternating direct and Sluice (undici, one keep-alive connection each); p50/p99 figures are the median over the runs.`,
      `Sustained load: autocannon, closed loop, ${CONNECTIONS.join('/')} connections, ${ROUNDS} rounds of ${STEP_SECONDS} s each, direct then Sluice in every round; added p99 compares the two at the same concurrency in the same round, and each step's figures are the medians over its rounds (their spread is under 'Noise of repeated runs'). autocannon's rate limit (overallRate) is a per-connection quota per second that each connection spends in one burst at the start of the second, so a run at a "rate" would measure a closed loop at that many connections anyway. CPU per request at a step is the gateway's, dispatcher's and Redis's CPU over that step's Sluice rounds over their requests; the goal's figure is the same over the whole sweep.`,
      'Everything (load generator, gateway, dispatcher, Redis, engine simulator) shares this machine: CPU per request shows where the time goes.',
    ];
    await oneAtATime(figures, runs);
    await sustained(figures, notes, runs);
    const result: ScenarioResult = {
      scenario: 'overhead',
      title: 'Overhead: direct to the engine against through Sluice',
      figures,
      runs,
      notes,
    };
    await whereTheTimeGoes(result);
    await withTenants(figures, notes);
    writeResult(result);
  },
  SCENARIO_TIMEOUT_MS,
);
