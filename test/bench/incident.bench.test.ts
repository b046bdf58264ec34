// The reference incident, time-scaled: the load test the reference PR planned and never ran
// (2 x 65k-token prompts and 15 x 8k-token prompts against `reasoning`), plus a steady trickle
// of short streaming chat requests whose time to first token is what users felt. Three setups,
// each against a fresh simulator in the `homelab` profile (the PR's engine):
//
//   direct     clients straight to the engine;
//   semaphore  three replicas of a per-replica semaphore of 4 (the design the PR replaced);
//   sluice     three gateways, one dispatcher, cap 4: Sluice with prefill-aware admission
//              (its defaults; only what a time-scaled run needs is set, see `deploy`).
//
// and each setup against two engine flag sets: the profile's defaults, and vLLM's recommended
// remedy `--long-prefill-token-threshold 512`. Six runs, one after another.
//
// Prompts are real text, `tokens x 4` characters (the simulator counts characters / 4 of the
// message contents; Sluice's gateway estimates characters / 4 of the message string values,
// the role `user` included, so a 8,192-token prompt is estimated at 8,193 tokens, above the
// 8,192 that makes a prompt long). Each starts with its kind and request index so that no two
// share a prefix-cache block. Short requests carry no priority header: Sluice tells them from
// long ones by the estimate alone.
//
// Clients are spread round-robin over the replicas. Every time here is SIMULATED seconds:
// the simulator runs `timeScale` times faster than the wall clock, so a wall-clock duration
// measured by the client is multiplied by `timeScale`. Nothing here asserts a timing.
import { performance } from 'node:perf_hooks';
import { Redis } from 'ioredis';
import { Agent } from 'undici';
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
import { timedChat } from './chat-client.ts';
import { round, summarize, writeResult, type Figure, type Series } from './results.ts';
import { startSemaphoreProxy, type SemaphoreProxy } from './semaphore-proxy.ts';

/**
 * Simulated seconds per wall-clock second. 15 keeps the six runs (1,000 to 1,150 simulated s
 * each, with the prefill cost that grows with context) under eight minutes of wall clock on
 * two cores (460 s measured: 68 to 70 s per direct or semaphore run, 80 and 101 s for Sluice).
 */
const timeScale = Number(process.env['BENCH_INCIDENT_TIME_SCALE'] ?? '15');
const CAP = 4;
const REPLICAS = 3;
const SAMPLE_MS = 50;
const MODEL = 'reasoning';
/** Sluice's default engine scrape period, 500 ms, scaled like everything else (50 ms at least). */
const scrapeMs = Math.max(50, Math.round(500 / timeScale));
/**
 * Sluice's aging limit for long prompts in simulated seconds (its default, 60, unless
 * BENCH_INCIDENT_AGING_SECONDS says otherwise, to measure the trade-off), in wall-clock seconds.
 */
const agingSimSeconds = Number(process.env['BENCH_INCIDENT_AGING_SECONDS'] ?? '60');
const agingSeconds = agingSimSeconds / timeScale;

// The workload, in simulated seconds and tokens; identical in every setup.
const LONG_PROMPTS = [65_536, 65_536, ...Array.from({ length: 15 }, () => 8_192)];
/** Long prompts go out this far apart, so that they reach every setup in the same order. */
const LONG_EVERY = 0.5;
const LONG_MAX_TOKENS = 256;
const SHORT_EVERY = 2;
const SHORT_UNTIL = 360;
const SHORT_PROMPT_TOKENS = 256;
const SHORT_MAX_TOKENS = 32;
/** The goal: Sluice's short-request TTFT p99 at least this many times better than direct's. */
const GOAL_RATIO = 5;

type SetupKey = 'direct' | 'semaphore' | 'sluice';
type FlagKey = 'defaults' | 'threshold';
type RunKey = `${SetupKey} ${FlagKey}`;

const SETUPS: SetupKey[] = ['direct', 'semaphore', 'sluice'];
const FLAG_SETS: FlagKey[] = ['defaults', 'threshold'];

const setupLabels: Record<SetupKey, string> = {
  direct: 'direct',
  semaphore: 'semaphore 4 x 3',
  sluice: 'Sluice',
};

const flagSets: Record<FlagKey, { label: string; words: string; args: string[] }> = {
  defaults: { label: 'defaults', words: 'default flags', args: [] },
  threshold: {
    label: 'threshold 512',
    words: '--long-prefill-token-threshold 512',
    args: ['--long-prefill-token-threshold', '512'],
  },
};

/** A run's name in figures and charts: `Sluice (threshold 512)`. No ': ' (the report splits there). */
const labelOf = (setup: SetupKey, flags: FlagKey) =>
  `${setupLabels[setup]} (${flagSets[flags].label})`;

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
  setup: SetupKey;
  flags: FlagKey;
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
const outcomes = new Map<RunKey, Outcome>();
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
    // The aging limit in simulated time, likewise.
    ADMISSION_LONG_AGING_SECONDS: String(agingSeconds),
  };
  const processes: SluiceProcess[] = [await startDispatcher(env)];
  for (let i = 0; i < REPLICAS; i += 1)
    processes.push(await startGateway(env, { keepOutput: false }));
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

/**
 * A prompt of `tokens` tokens for the simulator and the gateway alike: `tokens x 4` characters,
 * starting with the kind and the request index, so that no two prompts share a prefix-cache
 * block (the first block's hash already differs).
 */
function promptText(kind: 'long' | 'short', i: number, tokens: number): string {
  const head = `${kind} ${i} `;
  return (head + 'abcd'.repeat(tokens)).slice(0, tokens * 4);
}

function body(kind: 'long' | 'short', i: number, promptTokens: number, maxTokens: number): string {
  return JSON.stringify({
    model: MODEL,
    messages: [{ role: 'user', content: promptText(kind, i, promptTokens) }],
    max_tokens: maxTokens,
    stream: kind === 'short',
  });
}

async function send(target: string, payload: string, record: Sent): Promise<void> {
  const tail = await timedChat(target, payload, {}, agent, record);
  if (tail !== undefined)
    record.complete =
      record.status === 200 &&
      (record.kind === 'short'
        ? tail.endsWith('data: [DONE]\n\n')
        : tail.includes('"finish_reason"'));
}

async function runSetup(key: SetupKey, flags: FlagKey): Promise<Outcome> {
  const wallStart = performance.now();
  const engine = await startEngineSim([
    '--profile',
    'homelab',
    '--time-scale',
    String(timeScale),
    ...flagSets[flags].args,
  ]);
  let deployment: Deployment | undefined;
  try {
    deployment = await deploy(key, engine);
    const { targets } = deployment;
    // One tiny request through every replica: connections open, the path works end to end.
    for (const target of targets) {
      const warm: Sent = { kind: 'short', sentAt: performance.now() };
      await send(target, body('short', -1, 16, 1), warm);
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
      const maxTokens = kind === 'long' ? LONG_MAX_TOKENS : SHORT_MAX_TOKENS;
      await send(target, body(kind, i, tokens, maxTokens), record);
    });
    await Promise.all(requests);
    sampling = false;
    await sampler;
    const state = await engine.state();
    return {
      setup: key,
      flags,
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

/** What the figures, the goal and the findings are made of. */
function statsOf(o: Outcome) {
  const shorts = o.sent.filter((s) => s.kind === 'short');
  const ttft = shorts
    .filter((s) => s.firstTokenAt !== undefined && s.status === 200)
    .map((s) => sim(s.firstTokenAt! - s.sentAt));
  const { p50, p99 } = summarize(ttft);
  const longDone = o.sent
    .filter((s) => s.kind === 'long')
    .map((s) => sim((s.doneAt ?? o.start) - o.start));
  const longs = summarize(longDone);
  return {
    answered: ttft.length,
    p50,
    p99,
    longMedian: longs.median,
    longLast: longs.max,
    total: sim(Math.max(...o.sent.map((s) => s.doneAt ?? o.start)) - o.start),
    refused: o.sent.filter((s) => s.status === 429 || s.status === 503).length,
    failed: o.sent.filter((s) => !s.complete && s.status !== 429 && s.status !== 503).length,
    peakQueue: o.queueSeries.length === 0 ? undefined : Math.max(...o.queueSeries.map((p) => p[1])),
  };
}

/** Direct's short-request TTFT p99 over Sluice's, on one flag set; undefined if either is missing. */
function ratioOf(flags: FlagKey): number | undefined {
  const direct = outcomes.get(`direct ${flags}`);
  const sluice = outcomes.get(`sluice ${flags}`);
  if (!direct || !sluice) return undefined;
  return statsOf(direct).p99 / statsOf(sluice).p99;
}

function figuresOf(o: Outcome): Figure[] {
  const label = labelOf(o.setup, o.flags);
  const s = statsOf(o);
  const figures: Figure[] = [
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
      value: round(s.p50, 2),
      unit: 's (simulated)',
      note: `${s.answered} streaming requests; client wall clock x ${timeScale}`,
    },
    {
      name: `${label}: short-request TTFT p99`,
      value: round(s.p99, 2),
      unit: 's (simulated)',
      note: `client wall clock x ${timeScale}`,
    },
  ];
  const ratio = o.setup === 'sluice' ? ratioOf(o.flags) : undefined;
  if (ratio !== undefined)
    figures.push({
      name: `${label}: short TTFT p99, times better than direct`,
      value: round(ratio, 2),
      unit: 'x',
      goal: `>= ${GOAL_RATIO} (short TTFT p99 at least ${GOAL_RATIO}x better than direct, same engine flags)`,
      met: ratio >= GOAL_RATIO,
      note: `direct's p99 over Sluice's, both with ${flagSets[o.flags].words}`,
    });
  figures.push(
    {
      name: `${label}: median long prompt done`,
      value: round(s.longMedian, 1),
      unit: 's (simulated)',
      note: `the median of the ${LONG_PROMPTS.length} long prompts' answer times, from the first request sent`,
    },
    {
      name: `${label}: last long prompt done`,
      value: round(s.longLast, 1),
      unit: 's (simulated)',
      note: `until the last of the ${LONG_PROMPTS.length} long prompts was answered`,
    },
    { name: `${label}: refusals`, value: s.refused, unit: 'requests', note: '429 or 503' },
    {
      name: `${label}: failed or incomplete`,
      value: s.failed,
      unit: 'requests',
      note: 'errors other than refusals, and answers cut short',
    },
    {
      name: `${label}: total completion time`,
      value: round(s.total, 1),
      unit: 's (simulated)',
      note: 'first request sent to last answer received',
    },
  );
  if (s.peakQueue !== undefined)
    figures.push({
      name: `${label}: peak queue in front of the engine`,
      value: s.peakQueue,
      unit: 'requests',
      note: 'sampled every 50 ms of wall clock',
    });
  return figures;
}

/** The goal's verdict per flag set, in words, with what explains a miss. */
function findingsOf(): string[] {
  return FLAG_SETS.map((flags) => {
    const head = `Goal, short-request TTFT p99 at least ${GOAL_RATIO}x better than direct, ${flagSets[flags].words}:`;
    const direct = outcomes.get(`direct ${flags}`);
    const sluice = outcomes.get(`sluice ${flags}`);
    const ratio = ratioOf(flags);
    if (!direct || !sluice || ratio === undefined) return `${head} not measured (a run failed).`;
    const d = statsOf(direct);
    const l = statsOf(sluice);
    const verdict = ratio >= GOAL_RATIO ? 'MET' : 'NOT MET';
    return `${head} **${verdict}**, ${formatRatio(ratio)}x (direct ${round(d.p99, 1)} s, Sluice ${round(l.p99, 1)} s).${ratio >= GOAL_RATIO ? '' : ` ${WHY_NOT[flags]}`}`;
  });
}

const formatRatio = (r: number) => (r >= 10 ? round(r, 1) : round(r, 2)).toString();

/**
 * What bounds Sluice's short requests on a flag set whatever the order of release: the engine's
 * own step rules and cost (docs/broker.md, "What it cannot do"). Shown where the goal is missed;
 * the run's own series (charts) show where the time went.
 */
const WHY_NOT: Record<FlagKey, string> = {
  defaults:
    'With default flags vLLM gives a prefilling prompt the whole step budget (running requests are scheduled first), so nothing admitted beside it gets a token until its prefill ends (a 65k prompt: ~250 s on this engine). Sluice keeps that to one long prefill at a time per engine but cannot shorten it; the long prompts still have to be prefilled one after another, and short requests that arrive meanwhile wait for each.',
  threshold:
    'With the threshold, short requests decode beside a long prefill, but every step then carries a 512-token chunk at a deep context position (1 to 3 s on this engine), so a 32-token answer holds its slot for about a minute, and the free slots serve fewer short requests than the one every 2 s that arrive: the queue grows whatever the order of release, until the long prompts are done.',
};

function writeIncident(): void {
  const order = FLAG_SETS.flatMap((flags) => SETUPS.map((setup): RunKey => `${setup} ${flags}`));
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
  const label = (o: Outcome) => labelOf(o.setup, o.flags);
  for (const o of done) add('engine running + waiting', label(o), o.engineSeries);
  add('engine running + waiting', 'cap', cap);
  // The same without the direct setup, whose pile-up sets a scale on which 4 and 12 look alike.
  const brokered = done.filter((o) => o.setup !== 'direct');
  for (const o of brokered)
    add('engine running + waiting behind a broker', label(o), o.engineSeries);
  if (brokered.length > 0) add('engine running + waiting behind a broker', 'cap', cap);
  for (const o of done)
    if (o.queueSeries.length > 0) add('queue in front of the engine', label(o), o.queueSeries);
  for (const o of done)
    series.push({
      name: `short-request TTFT by send time: ${label(o)}`,
      unit: 'simulated seconds',
      points: o.sent
        .filter((r) => r.kind === 'short' && r.firstTokenAt !== undefined)
        .map((r) => [round(sim(r.sentAt - o.start), 2), round(sim(r.firstTokenAt! - r.sentAt), 2)]),
    });

  const longTokens = LONG_PROMPTS.reduce((a, b) => a + b, 0);
  const notes = [
    `Time scale ${timeScale}: the simulator (homelab profile: max_num_seqs 4, max_num_batched_tokens 2,048, 152,432 KV tokens, prefill 525 tok/s plus a cost per token that grows with its context position, so a 65k prompt alone takes ~250 s) runs ${timeScale}x faster than the wall clock. Every duration here is in simulated seconds: the client measures wall-clock time and multiplies it by ${timeScale}, so the broker's own overhead is scaled up by the same factor (a millisecond of wall clock reads as ${timeScale} ms).`,
    `Engine flags: each setup ran twice, on a fresh simulator with the profile's defaults ("defaults") and with vLLM's recommended --long-prefill-token-threshold 512 ("threshold 512"), which caps one request's prefill chunk per step at 512 tokens so that the rest of the 2,048-token step budget goes to the other running requests.`,
    `Workload, the same in each run: ${LONG_PROMPTS.length} long prompts (2 x 65,536 and 15 x 8,192 tokens, ${longTokens.toLocaleString('en-US')} tokens in all; max_tokens ${LONG_MAX_TOKENS}, not streaming) sent ${LONG_EVERY} s apart from t = 0, and a short streaming chat request (${SHORT_PROMPT_TOKENS} prompt tokens, max_tokens ${SHORT_MAX_TOKENS}) every ${SHORT_EVERY} s for ${SHORT_UNTIL} s (${Math.ceil(SHORT_UNTIL / SHORT_EVERY)} requests). Prompts are real text of tokens x 4 characters, each starting with its kind and index (no two share a prefix-cache block). Clients go round-robin over ${REPLICAS} replicas (the direct setup has one engine address).`,
    'No request carries a priority header. Sluice tells the long prompts from the short ones by its own estimate of the prompt (characters / 4 of the message strings, above 8,192 tokens is long): long prompts hold at most half of the engine slots (2 of 4), prefill one at a time, must fit the free KV, and wait in Sluice while short requests pass, up to the aging limit. The semaphore proxies and the engine serve strictly in arrival order.',
    'A non-streaming long prompt gives Sluice no first-byte signal for the end of its prefill; with no prefill rate measured on long streams (there are none here), Sluice counts it as in prefill until it completes, so in this workload long prompts go to the engine strictly one after another, decode included. That is what the long-prompt completion figures of the Sluice rows show.',
    `Sluice ran with degradation off (SLUICE_DEGRADATION=off), so that every setup generates the same answers; its engine scrape period and long-prompt aging limit were scaled like the engine (${scrapeMs} ms of wall clock = ${round((scrapeMs / 1000) * timeScale, 2)} simulated s, default 0.5 s; ${round(agingSeconds, 3)} s of wall clock = ${agingSimSeconds} simulated s${agingSimSeconds === 60 ? ', the default' : ''}), queue depth and park limit raised so that nothing is refused (1,000 requests, 600 s); the rest are the defaults (KV gate at 0.9, long prompts above 8,192 tokens, at most half the slots, one prefill at a time). What is not scaled is the broker's own work per request: a few milliseconds of wall clock to enqueue, release and relay read ${timeScale} times longer here.`,
    'Peak engine concurrency is the simulator own high-water mark of running + waiting (/sim/state peakRequests), reset after a warm-up request through every replica; the charts sample it every 50 ms of wall clock (stored samples: those where the value changed). The queue in front of the engine is the sum of the three proxies in-memory queues (semaphore) or what Sluice holds in Redis (BullMQ wait, prioritized and the delayed set where held long prompts wait); direct has none, its queue is the engine waiting list.',
    'TTFT: from sending the request to the first `data:` line of the stream (keep-alive comments excluded). One run per setup and flag set: the engine simulation is deterministic, so the spread between runs is client timing only (a sample interval, about 50 ms x time scale at worst).',
    ...done.map(
      (o) =>
        `${label(o)}: ${round(o.wallSeconds, 1)} s of wall clock including start-up; engine peak running ${o.peakRunning}, preemptions ${o.preemptions}.`,
    ),
  ];
  const missing = order.filter((k) => !outcomes.has(k));
  if (missing.length > 0)
    notes.push(`Not measured (the run failed or was not selected): ${missing.join(', ')}.`);
  writeResult({
    scenario: 'incident',
    title:
      'The reference incident: 2 x 65k + 15 x 8k prompts and a chat trickle, homelab engine, default flags and --long-prefill-token-threshold 512',
    figures: done.flatMap(figuresOf),
    findings: findingsOf(),
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

  // The longest run should be about 1,100 simulated seconds; a wide margin over it (a run that
  // stalls still gets to finish and be reported), never under 10 min.
  const timeout = Math.max(600_000, Math.round((6_000 / timeScale) * 1000));
  for (const flags of FLAG_SETS)
    for (const setup of SETUPS)
      it(`${labelOf(setup, flags)}: every request answered or refused`, { timeout }, async () => {
        const outcome = await runSetup(setup, flags);
        outcomes.set(`${setup} ${flags}`, outcome);
        // Not a timing: every request came back one way or another.
        expect(outcome.sent.every((s) => s.doneAt !== undefined)).toBe(true);
      });
});
