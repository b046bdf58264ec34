// The floors: what Sluice's required parts cost on this machine with none of Sluice's work in
// them. Two bare gateway-and-dispatcher pairs (test/bench/hop-floor/) carry each request the
// way Sluice does, client -> gateway -> Redis -> dispatcher -> engine -> dispatcher -> Redis
// (pub/sub) -> gateway -> client: "hops" with one LPUSH, one blocking BRPOP and one PUBLISH,
// and "hops + BullMQ" with a plain BullMQ Queue and Worker set up as Sluice sets up a pool's
// queue. Direct, both floors and Sluice run alternated on one Redis and one engine simulator,
// so all four see the same machine: the difference between a floor and Sluice is Sluice's own
// work, the difference between direct and a floor is the floor's.
import { fileURLToPath } from 'node:url';
import { Agent, request } from 'undici';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { startProcess, startStack, type Stack, type StartedProcess } from '../support/index.ts';
import { cpuSeconds, round, summarize, writeResult, type Figure } from './results.ts';

const WARMUP = 100;
const REQUESTS = 300;
const RUNS = 3;
/** Closed-loop concurrency steps, each run for STEP_SECONDS after STEP_WARMUP rounds. */
const CONNECTIONS = [1, 2, 4, 8, 16];
const STEP_SECONDS = 3;
const STEP_WARMUP = 200;

const body = JSON.stringify({
  model: 'm',
  messages: [{ role: 'user', content: 'Say hello.' }],
  max_tokens: 16,
});
const headers = { 'content-type': 'application/json' };
const script = (name: string) => fileURLToPath(new URL(`./hop-floor/${name}`, import.meta.url));

interface Path {
  name: string;
  url: string;
  /** The broker's processes, whose CPU is counted: gateway, dispatcher, Redis (none direct). */
  pids: number[];
}

let stack: Stack;
const floors: StartedProcess[] = [];
let paths: Path[];

/** Starts one floor's dispatcher and gateway; answers its path. */
async function startFloor(floor: 'list' | 'bullmq', name: string): Promise<Path> {
  const dispatcher = await startProcess({
    command: process.execPath,
    args: [script('dispatcher.mjs'), stack.redis.url, stack.sim.url, floor],
    ready: /^ready$/,
  });
  floors.push(dispatcher);
  const gateway = await startProcess({
    command: process.execPath,
    args: [script('gateway.mjs'), stack.redis.url, floor],
    ready: /"url":"([^"]+)"/,
  });
  floors.push(gateway);
  const pids = [gateway.child.pid!, dispatcher.child.pid!, stack.redis.process.child.pid!];
  return { name, url: gateway.ready[1]!, pids };
}

beforeAll(async () => {
  stack = await startStack({
    keepGatewayOutput: false,
    env: { ADMISSION_MAX_INFLIGHT: '64', VLLM_MAX_QUEUE_DEPTH: '100000' },
  });
  paths = [
    { name: 'direct', url: stack.sim.url, pids: [] },
    await startFloor('list', 'hops'),
    await startFloor('bullmq', 'hops + BullMQ'),
    {
      name: 'Sluice',
      url: stack.gateway.url,
      pids: [
        stack.gateway.process.child.pid!,
        stack.dispatcher.process.child.pid!,
        stack.redis.process.child.pid!,
      ],
    },
  ];
});

afterAll(async () => {
  await Promise.all(floors.map((p) => p.stop()));
  await stack?.stop();
});

/** One non-streaming request through `agent`, in ms until its whole body. */
async function once(url: string, agent: Agent): Promise<number> {
  const start = performance.now();
  const res = await request(`${url}/v1/chat/completions`, {
    method: 'POST',
    headers,
    body,
    dispatcher: agent,
  });
  await res.body.text();
  if (res.statusCode !== 200) throw new Error(`${url}: HTTP ${res.statusCode}`);
  return performance.now() - start;
}

/** `connections` clients in a closed loop: rate, p50, p99, and broker CPU per request (ms). */
async function closedLoop(path: Path, connections: number) {
  const agent = new Agent({ connections });
  const all = () => Promise.all(Array.from({ length: connections }, () => once(path.url, agent)));
  for (let i = 0; i < STEP_WARMUP; i += 1) await all();
  const latencies: number[] = [];
  const cpuBefore = path.pids.map(cpuSeconds);
  const end = performance.now() + STEP_SECONDS * 1000;
  await Promise.all(
    Array.from({ length: connections }, async () => {
      while (performance.now() < end) latencies.push(await once(path.url, agent));
    }),
  );
  const cpu = path.pids.reduce((sum, pid, i) => sum + cpuSeconds(pid) - cpuBefore[i]!, 0);
  await agent.close();
  const { p50, p99 } = summarize(latencies);
  return {
    rate: latencies.length / STEP_SECONDS,
    p50,
    p99,
    cpuMs: (cpu * 1000) / latencies.length,
  };
}

/** One request at a time, each path in turn: the p50 and p99 each path adds to direct's. */
async function oneAtATime(figures: Figure[]): Promise<Map<string, number>> {
  const agent = new Agent({ connections: 1 });
  const times = new Map<string, number[]>(paths.map((p) => [p.name, []]));
  for (let i = 0; i < WARMUP; i += 1) for (const p of paths) await once(p.url, agent);
  for (let i = 0; i < RUNS * REQUESTS; i += 1)
    for (const p of paths) times.get(p.name)!.push(await once(p.url, agent));
  await agent.close();
  const direct = summarize(times.get('direct')!);
  const addedP50 = new Map<string, number>();
  for (const p of paths.slice(1)) {
    const { p50, p99 } = summarize(times.get(p.name)!);
    addedP50.set(p.name, p50 - direct.p50);
    figures.push(
      { name: `${p.name}: added p50, one at a time`, value: round(p50 - direct.p50), unit: 'ms' },
      { name: `${p.name}: added p99, one at a time`, value: round(p99 - direct.p99), unit: 'ms' },
    );
  }
  return addedP50;
}

it('measures the floors against Sluice, one at a time and under load', async () => {
  const figures: Figure[] = [];
  const addedP50 = await oneAtATime(figures);
  const rows: string[][] = [];
  const at4 = new Map<string, { rate: number; added: number; cpuMs: number }>();
  for (const connections of CONNECTIONS) {
    const steps = [];
    for (const p of paths) steps.push({ path: p, ...(await closedLoop(p, connections)) });
    const direct = steps[0]!;
    for (const s of steps) {
      const added = s.p99 - direct.p99;
      const broker = s.path.pids.length > 0;
      rows.push([
        String(connections),
        s.path.name,
        String(round(s.rate, 0)),
        String(round(s.p50, 2)),
        String(round(s.p99, 2)),
        broker ? String(round(added, 2)) : '',
        broker ? String(round(s.cpuMs)) : '',
      ]);
      if (!broker) continue;
      expect(s.rate, `${s.path.name} answered`).toBeGreaterThan(0);
      const on = `${connections} connection${connections > 1 ? 's' : ''}`;
      figures.push(
        { name: `${s.path.name}: rate, ${on}`, value: round(s.rate, 0), unit: 'req/s' },
        { name: `${s.path.name}: added p99, ${on}`, value: round(added), unit: 'ms' },
        {
          name: `${s.path.name}: CPU per request (gateway + dispatcher + Redis), ${on}`,
          value: round(s.cpuMs),
          unit: 'ms',
        },
      );
      if (connections === 4) at4.set(s.path.name, { rate: s.rate, added, cpuMs: s.cpuMs });
    }
  }
  const say = (name: string) => {
    const s = at4.get(name)!;
    return `${name} ${round(s.rate, 0)} req/s with an added p99 of ${round(s.added, 1)} ms and ${round(s.cpuMs, 2)} ms of CPU per request`;
  };
  writeResult({
    scenario: 'hop-floor',
    title: "The floors: Sluice's hops and queue alone, against Sluice",
    figures,
    tables: [
      {
        title: `Closed loop, ${STEP_SECONDS} s per path and step, the paths in turn at each step`,
        head: [
          'Connections',
          'Path',
          'req/s',
          'p50 (ms)',
          'p99 (ms)',
          'Added p99 (ms)',
          'CPU ms/req',
        ],
        rows,
      },
    ],
    notes: [
      'The floors\' gateways and dispatchers (test/bench/hop-floor/) carry each request over Sluice\'s hops with no admission, frames, metrics or logs: "hops" with one LPUSH, one BRPOP and one PUBLISH; "hops + BullMQ" with BullMQ\'s add and a plain Worker (concurrency and global concurrency 64, the events stream trimmed, prioritised jobs removed when done, as Sluice\'s pools).',
      `One at a time: ${WARMUP} warm-up rounds, then ${RUNS * REQUESTS} rounds of one request on each path in turn (undici, one keep-alive connection).`,
      `Under load: undici clients in a closed loop, ${STEP_WARMUP} warm-up rounds, then ${STEP_SECONDS} s per path and step; CPU per request is the gateway's, the dispatcher's and Redis's together.`,
    ],
    findings: [
      `One at a time the hops alone add ${round(addedP50.get('hops')!, 2)} ms (p50), the hops with BullMQ ${round(addedP50.get('hops + BullMQ')!, 2)} ms and Sluice ${round(addedP50.get('Sluice')!, 2)} ms.`,
      `At 4 connections: ${say('hops')}; ${say('hops + BullMQ')}; ${say('Sluice')}.`,
    ],
  });
});
