// The reference incident, time-scaled: the load test the reference PR planned and never ran
// (2 x 65k-token prompts and 15 x 8k-token prompts against `reasoning`), plus a steady trickle
// of short streaming chat requests whose time to first token is what users felt. Three setups
// in one run, each against a fresh simulator in the `homelab` profile (the PR's engine):
//
//   direct     clients straight to the engine;
//   semaphore  three replicas of a per-replica semaphore of 4 (the design the PR replaced);
//   sluice     three gateways, one dispatcher, cap 4.
//
// Clients are spread round-robin over the replicas. Every time here is SIMULATED seconds:
// the simulator runs `timeScale` times faster than the wall clock, so a wall-clock duration
// measured by the client is multiplied by `timeScale`. Nothing here asserts a timing.
import { performance } from 'node:perf_hooks';
import { Redis } from 'ioredis';
import { Agent, request } from 'undici';
import { afterAll, describe, expect, it } from 'vitest';
import {
  eventually,
  queuedJobs,
  startDispatcher,
  startEngineSim,
  startGateway,
  startRedis,
  type SluiceProcess,
  type TestEngineSim,
  type TestRedis,
} from '../support/index.ts';
import { round, summarize, writeResult, type Figure, type Series } from './results.ts';
import { startSemaphoreProxy, type SemaphoreProxy } from './semaphore-proxy.ts';

/** Simulated seconds per wall-clock second. 10 keeps one setup near a minute of wall clock. */
const timeScale = Number(process.env['BENCH_INCIDENT_TIME_SCALE'] ?? '10');
const CAP = 4;
const REPLICAS = 3;
const SAMPLE_MS = 50;
const MODEL = 'reasoning';
/** Sluice's default engine scrape period, 500 ms, scaled like everything else (50 ms at least). */
const scrapeMs = Math.max(50, Math.round(500 / timeScale));

// The workload, in simulated seconds and tokens; identical in every setup.
const LONG_PROMPTS = [65_536, 65_536, ...Array.from({ length: 15 }, () => 8_192)];
/** Long prompts go out this far apart, so that they reach every setup in the same order. */
const LONG_EVERY = 0.5;
const LONG_MAX_TOKENS = 256;
const SHORT_EVERY = 2;
const SHORT_UNTIL = 360;
const SHORT_PROMPT_TOKENS = 256;
const SHORT_MAX_TOKENS = 32;
/** Short requests ask for the top priority class; only Sluice reads the header. */
const SHORT_PRIORITY = '10';

type SetupKey = 'direct' | 'semaphore' | 'sluice';

const labels: Record<SetupKey, string> = {
  direct: 'direct',
  semaphore: 'semaphore 4 x 3',
  sluice: 'Sluice',
};

interface Deployment {
  /** Where clients send requests, round-robin. */
  targets: string[];
  /** Requests waiting in front of the engine (outside it), or undefined where there is no such queue. */
  queued(): Promise<number | undefined>;
  stop(): Promise<void>;
}

interface Sent {
  kind: 'long' | 'short';
  sentAt: number;
  status?: number;
  firstTokenAt?: number;
  doneAt?: number;
  complete?: boolean;
  error?: string;
}

interface Outcome {
  key: SetupKey;
  sent: Sent[];
  start: number;
  peakRequests: number;
  peakRunning: number;
  preemptions: number;
  engineSeries: Array<[number, number]>;
  queueSeries: Array<[number, number]>;
  wallSeconds: number;
}

// No client-side timeouts: in the direct setup a request may wait minutes for its first byte.
const agent = new Agent({ headersTimeout: 0, bodyTimeout: 0 });
const outcomes = new Map<SetupKey, Outcome>();
const scenarioStart = performance.now();

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
/** Wall-clock milliseconds to simulated seconds. */
const sim = (ms: number) => (ms / 1000) * timeScale;

/**
 * The samples a chart needs: the first and last, and each one whose value differs from the
 * sample before or after it (a step stays a step; a flat stretch becomes its two ends).
 */
function compact(points: Array<[number, number]>): Array<[number, number]> {
  return points.filter(
    ([, v], i) =>
      i === 0 || i === points.length - 1 || v !== points[i - 1]![1] || v !== points[i + 1]![1],
  );
}

async function deploy(key: SetupKey, engine: TestEngineSim): Promise<Deployment> {
  if (key === 'direct')
    return { targets: [engine.url], queued: async () => undefined, stop: async () => {} };
  if (key === 'semaphore') {
    const proxies: SemaphoreProxy[] = [];
    for (let i = 0; i < REPLICAS; i += 1) proxies.push(await startSemaphoreProxy(engine.url, CAP));
    return {
      targets: proxies.map((p) => p.url),
      queued: async () => proxies.reduce((n, p) => n + p.queued, 0),
      stop: async () => {
        await Promise.all(proxies.map((p) => p.close()));
      },
    };
  }
  const redis: TestRedis = await startRedis();
  const env = {
    REDIS_URL: redis.url,
    VLLM_URL: engine.url,
    VLLM_MODEL: MODEL,
    ADMISSION_MAX_INFLIGHT: String(CAP),
    VLLM_MAX_QUEUE_DEPTH: '1000',
    ADMISSION_MAX_PARK_SECONDS: '600',
    // Degradation would shorten answers under load and so change the workload; this compares
    // admission alone.
    SLUICE_DEGRADATION: 'off',
    // The default scrape period (500 ms) in simulated time, as a real deployment would see it.
    ENGINE_SCRAPE_INTERVAL_MS: String(scrapeMs),
  };
  const processes: SluiceProcess[] = [await startDispatcher(env)];
  for (let i = 0; i < REPLICAS; i += 1) processes.push(await startGateway(env));
  const gateways = processes.slice(1);
  // Ready = Redis answers and the pool has a leader.
  for (const gateway of gateways)
    await eventually(
      async () => (await fetch(`${gateway.url}/readyz`)).ok || undefined,
      'gateway ready',
    );
  const client = new Redis(redis.url);
  await client.ping(); // connected before the first sample
  return {
    targets: gateways.map((g) => g.url),
    queued: () => queuedJobs(client),
    stop: async () => {
      await client.quit();
      await Promise.all(processes.map((p) => p.stop()));
      await redis.stop();
    },
  };
}

function body(kind: 'long' | 'short', i: number, promptTokens: number, maxTokens: number): string {
  return JSON.stringify({
    model: MODEL,
    messages: [{ role: 'user', content: `${kind} request ${i}` }],
    sim_prompt_tokens: promptTokens,
    max_tokens: maxTokens,
    stream: kind === 'short',
  });
}

async function send(
  target: string,
  payload: string,
  headers: Record<string, string>,
  record: Sent,
): Promise<void> {
  try {
    const res = await request(`${target}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', ...headers },
      body: payload,
      dispatcher: agent,
    });
    record.status = res.statusCode;
    let tail = '';
    for await (const chunk of res.body) {
      const text = (chunk as Buffer).toString('utf8');
      // Keep-alive comments (`: keep-alive`) are not tokens; the first `data:` line is.
      if (record.firstTokenAt === undefined && text.includes('data: '))
        record.firstTokenAt = performance.now();
      tail = (tail + text).slice(-256);
    }
    record.doneAt = performance.now();
    record.complete =
      res.statusCode === 200 &&
      (record.kind === 'short'
        ? tail.endsWith('data: [DONE]\n\n')
        : tail.includes('"finish_reason"'));
  } catch (err) {
    record.doneAt = performance.now();
    record.error = (err as Error).message;
  }
}

async function runSetup(key: SetupKey): Promise<Outcome> {
  const wallStart = performance.now();
  const engine = await startEngineSim(['--profile', 'homelab', '--time-scale', String(timeScale)]);
  let deployment: Deployment | undefined;
  try {
    deployment = await deploy(key, engine);
    const { targets } = deployment;
    // One tiny request through every replica: connections open, the path works end to end.
    for (const target of targets) {
      const warm: Sent = { kind: 'short', sentAt: performance.now() };
      await send(target, body('short', -1, 16, 1), {}, warm);
      if (!warm.complete) throw new Error(`${key}: warm-up through ${target} failed`);
    }
    await fetch(`${engine.url}/sim/peak/reset`, { method: 'POST' });

    // The schedule: [simulated second, kind, prompt tokens], in time order.
    const schedule: Array<[number, 'long' | 'short', number]> = [];
    LONG_PROMPTS.forEach((tokens, i) => schedule.push([i * LONG_EVERY, 'long', tokens]));
    for (let t = 0; t < SHORT_UNTIL; t += SHORT_EVERY)
      schedule.push([t + SHORT_EVERY / 4, 'short', SHORT_PROMPT_TOKENS]);
    schedule.sort((a, b) => a[0] - b[0]);

    const sent: Sent[] = [];
    const engineSeries: Array<[number, number]> = [];
    const queueSeries: Array<[number, number]> = [];
    const start = performance.now();
    let sampling = true;
    const sampler = (async () => {
      while (sampling) {
        const at = performance.now();
        const [state, queued] = await Promise.all([engine.state(), deployment!.queued()]);
        // Stamp the reading halfway through the round trips that took it.
        const t = round(sim((at + performance.now()) / 2 - start), 2);
        engineSeries.push([t, state.running + state.waiting]);
        if (queued !== undefined) queueSeries.push([t, queued]);
        await sleep(Math.max(0, SAMPLE_MS - (performance.now() - at)));
      }
    })();

    let next = 0;
    const requests = schedule.map(async ([at, kind, tokens], i) => {
      const due = start + (at / timeScale) * 1000;
      await sleep(Math.max(0, due - performance.now()));
      const record: Sent = { kind, sentAt: performance.now() };
      sent.push(record);
      const target = targets[next++ % targets.length]!;
      const headers: Record<string, string> =
        kind === 'short' ? { 'x-sluice-priority': SHORT_PRIORITY } : {};
      const maxTokens = kind === 'long' ? LONG_MAX_TOKENS : SHORT_MAX_TOKENS;
      await send(target, body(kind, i, tokens, maxTokens), headers, record);
    });
    await Promise.all(requests);
    sampling = false;
    await sampler;
    const state = await engine.state();
    return {
      key,
      sent,
      start,
      peakRequests: state.peakRequests,
      peakRunning: Number(state['peakRunning']),
      preemptions: Number(state['preemptions']),
      engineSeries,
      queueSeries,
      wallSeconds: (performance.now() - wallStart) / 1000,
    };
  } finally {
    await deployment?.stop();
    await engine.stop();
  }
}

function figuresOf(o: Outcome): Figure[] {
  const label = labels[o.key];
  const shorts = o.sent.filter((s) => s.kind === 'short');
  const ttft = shorts
    .filter((s) => s.firstTokenAt !== undefined && s.status === 200)
    .map((s) => sim(s.firstTokenAt! - s.sentAt));
  const { p50, p99 } = summarize(ttft);
  const refused = o.sent.filter((s) => s.status === 429 || s.status === 503).length;
  const failed = o.sent.filter((s) => !s.complete && s.status !== 429 && s.status !== 503).length;
  const end = (list: Sent[]) => sim(Math.max(...list.map((s) => s.doneAt ?? o.start)) - o.start);
  return [
    {
      name: `${label}: peak engine running + waiting`,
      value: o.peakRequests,
      unit: 'requests',
      goal: `<= ${CAP} (the cap)`,
      met: o.peakRequests <= CAP,
      note: 'peak engine concurrency never above the cap (vllm running + waiting, /sim/state)',
    },
    {
      name: `${label}: short-request TTFT p50`,
      value: round(p50, 2),
      unit: 's (simulated)',
      note: `${ttft.length} streaming requests; client wall clock x ${timeScale}`,
    },
    {
      name: `${label}: short-request TTFT p99`,
      value: round(p99, 2),
      unit: 's (simulated)',
      note: `client wall clock x ${timeScale}`,
    },
    { name: `${label}: refusals`, value: refused, unit: 'requests', note: '429 or 503' },
    {
      name: `${label}: failed or incomplete`,
      value: failed,
      unit: 'requests',
      note: 'errors other than refusals, and answers cut short',
    },
    {
      name: `${label}: long prompts done`,
      value: round(end(o.sent.filter((s) => s.kind === 'long')), 1),
      unit: 's (simulated)',
      note: 'until the last of the 17 long prompts was answered',
    },
    {
      name: `${label}: total completion time`,
      value: round(end(o.sent), 1),
      unit: 's (simulated)',
      note: 'first request sent to last answer received',
    },
  ];
}

function writeIncident(): void {
  const order: SetupKey[] = ['direct', 'semaphore', 'sluice'];
  const done = order.flatMap((k) => (outcomes.has(k) ? [outcomes.get(k)!] : []));
  if (done.length === 0) return;
  const lastT = Math.max(...done.map((o) => o.engineSeries.at(-1)?.[0] ?? 0));
  const cap: Array<[number, number]> = [
    [0, CAP],
    [lastT, CAP],
  ];
  const series: Series[] = [];
  const add = (chart: string, line: string, points: Array<[number, number]>) =>
    series.push({ name: `${chart}: ${line}`, unit: 'requests', points: compact(points) });
  for (const o of done) add('engine running + waiting', labels[o.key], o.engineSeries);
  add('engine running + waiting', 'cap', cap);
  // The same without the direct setup, whose pile-up sets a scale on which 4 and 12 look alike.
  const brokered = done.filter((o) => o.key !== 'direct');
  for (const o of brokered)
    add('engine running + waiting behind a broker', labels[o.key], o.engineSeries);
  if (brokered.length > 0) add('engine running + waiting behind a broker', 'cap', cap);
  for (const o of done)
    if (o.queueSeries.length > 0) add('queue in front of the engine', labels[o.key], o.queueSeries);
  for (const o of done)
    series.push({
      name: `short-request TTFT by send time: ${labels[o.key]}`,
      unit: 'simulated seconds',
      points: o.sent
        .filter((r) => r.kind === 'short' && r.firstTokenAt !== undefined)
        .map((r) => [round(sim(r.sentAt - o.start), 2), round(sim(r.firstTokenAt! - r.sentAt), 2)]),
    });

  const longTokens = LONG_PROMPTS.reduce((a, b) => a + b, 0);
  const notes = [
    `Time scale ${timeScale}: the simulator (homelab profile: max_num_seqs 4, 152,432 KV tokens, 525 tok/s prefill) runs ${timeScale}x faster than the wall clock. Every duration here is in simulated seconds: the client measures wall-clock time and multiplies it by ${timeScale}, so the broker's own overhead is scaled up by the same factor (a millisecond of wall clock reads as ${timeScale} ms).`,
    `Workload, the same in each setup: ${LONG_PROMPTS.length} long prompts (2 x 65,536 and 15 x 8,192 tokens, ${longTokens.toLocaleString('en-US')} tokens in all; max_tokens ${LONG_MAX_TOKENS}, not streaming) sent ${LONG_EVERY} s apart from t = 0, and a short streaming chat request (${SHORT_PROMPT_TOKENS} prompt tokens, max_tokens ${SHORT_MAX_TOKENS}) every ${SHORT_EVERY} s for ${SHORT_UNTIL} s (${Math.ceil(SHORT_UNTIL / SHORT_EVERY)} requests). Clients go round-robin over ${REPLICAS} replicas (the direct setup has one engine address).`,
    `Short requests carry x-sluice-priority: ${SHORT_PRIORITY} in every setup; only Sluice reads it (higher first, FIFO within a class), so Sluice lets them pass the queued long prompts. The semaphore proxies and the engine serve strictly in arrival order.`,
    `Sluice ran with degradation off (SLUICE_DEGRADATION=off), so that every setup generates the same answers; its engine scrape period was scaled like the engine (${scrapeMs} ms of wall clock = ${round((scrapeMs / 1000) * timeScale, 2)} simulated s; the default is 0.5 s), the rest are the defaults (KV gate at 0.9). What is not scaled is the broker's own work per request: a few milliseconds of wall clock to enqueue, release and relay read ${timeScale} times longer here, which shows most while short requests drain one after another.`,
    'Peak engine concurrency is the simulator own high-water mark of running + waiting (/sim/state peakRequests), reset after a warm-up request through every replica; the charts sample it every 50 ms of wall clock (stored samples: those where the value changed). The queue in front of the engine is the sum of the three proxies in-memory queues (semaphore) or BullMQ wait + prioritized in Redis (Sluice); direct has none, its queue is the engine waiting list.',
    'TTFT: from sending the request to the first `data:` line of the stream (keep-alive comments excluded). One run per setup: the engine simulation is deterministic, so the spread between runs is client timing only (a sample interval, about 50 ms x time scale at worst).',
    ...done.map(
      (o) =>
        `${labels[o.key]}: ${round(o.wallSeconds, 1)} s of wall clock including start-up; engine peak running ${o.peakRunning}, preemptions ${o.preemptions}.`,
    ),
  ];
  const missing = order.filter((k) => !outcomes.has(k));
  if (missing.length > 0) notes.push(`Not measured (the setup failed): ${missing.join(', ')}.`);
  writeResult({
    scenario: 'incident',
    title: 'The reference incident: 2 x 65k + 15 x 8k prompts and a chat trickle, homelab engine',
    figures: done.flatMap(figuresOf),
    series,
    notes,
  });
}

describe('the reference incident (homelab profile, time-scaled)', () => {
  afterAll(async () => {
    writeIncident();
    await agent.close();
    console.log(
      `incident scenario: ${round((performance.now() - scenarioStart) / 1000, 1)} s of wall clock`,
    );
  });

  for (const key of ['direct', 'semaphore', 'sluice'] as const)
    it(`${labels[key]}: every request answered or refused`, { timeout: 300_000 }, async () => {
      const outcome = await runSetup(key);
      outcomes.set(key, outcome);
      // Not a timing: every request came back one way or another.
      expect(outcome.sent.every((s) => s.doneAt !== undefined)).toBe(true);
    });
});
