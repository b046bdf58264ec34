// Fairness: a light tenant's time to first token while a heavy tenant floods the same engine.
// One engine simulator (`instant` profile, slow enough decode that an answer takes ~70 ms),
// cap 4, one dispatcher, two gateways, fresh processes for each of three runs:
//
//   alone      light alone, tenants configured;
//   fair       light with heavy flooding, tenants configured: the dispatcher releases next
//              from the tenant with the least weighted service (VTC);
//   fifo       the same load with NO tenants in the file: one anonymous tenant, FIFO within a
//              priority (the "before").
//
// Light sends a short streaming chat request every 200 ms. Heavy is a closed loop of 40
// outstanding requests (a batch client with 40 workers): each answer is followed at once by
// the next request. Why a closed loop rather than an open one at 10x light's rate: the engine
// serves ~55 of these answers a second; an open loop is either below that (no queue, nothing
// to be fair about) or above it (a queue that grows with the run's length, so the FIFO figure
// would measure how long the run was, and draining it afterwards would blow the time budget),
// and where the line falls depends on how busy this 2-core machine is. A closed loop holds a
// steady backlog (40 - 4 in flight = ~36 queued) whatever the machine's speed, its throughput
// is whatever the engine gives it (comparable between fair and fifo: fairness must not waste
// the engine), and it is served about 10x light's rate (a figure of each run says how close).
//
// Nothing here asserts a timing: the scenario reports; it asserts the cap and that every
// request was answered.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
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
} from '../support/index.ts';
import { timedChat } from './chat-client.ts';
import { quantile, round, summarize, writeResult, type Figure, type Series } from './results.ts';

const CAP = 4;
const GATEWAYS = 2;
const POOL = 'main';
const MODEL = 'm';
/** Light: one streaming request every LIGHT_EVERY_MS for LIGHT_SECONDS. */
const LIGHT_EVERY_MS = 200;
const LIGHT_SECONDS = Number(process.env['BENCH_FAIRNESS_SECONDS'] ?? '30');
/** Heavy: requests kept outstanding by its closed loop. */
const HEAVY_BACKLOG = 40;
const MAX_TOKENS = 16;
/**
 * Simulated seconds per decoding sequence per step: with 4 sequences decoding, a step takes
 * 4 x 1.2 ms and a 16-token answer ~72 ms, so the engine serves ~55 answers a second at the
 * cap: 5 for light and ~50 for heavy, 10x light's rate.
 */
const DECODE_SECONDS = Number(process.env['BENCH_FAIRNESS_DECODE_SECONDS'] ?? '0.0012');
const SAMPLE_MS = 100;
const KEYS = {
  light: 'sk-light-bench-fairness-01234567',
  heavy: 'sk-heavy-bench-fairness-01234567',
};

type Tenant = 'light' | 'heavy';
type RunKey = 'alone' | 'fair' | 'fifo';
const RUNS: RunKey[] = ['alone', 'fair', 'fifo'];

const runs: Record<RunKey, { label: string; tenants: boolean; heavy: boolean; words: string }> = {
  alone: { label: 'light alone', tenants: true, heavy: false, words: 'light alone' },
  fair: {
    label: 'fair share',
    tenants: true,
    heavy: true,
    words: 'heavy flooding, tenants configured',
  },
  fifo: {
    label: 'FIFO',
    tenants: false,
    heavy: true,
    words: 'heavy flooding, no tenants (FIFO)',
  },
};

interface Sent {
  tenant: Tenant;
  sentAt: number;
  status?: number;
  firstTokenAt?: number;
  doneAt?: number;
  complete?: boolean;
  error?: string;
}

interface Outcome {
  sent: Sent[];
  /** Light's first request went out / its last answer ended. */
  windowStart: number;
  windowEnd: number;
  peakRequests: number;
  queueSeries: Array<[number, number]>;
  wallSeconds: number;
}

const agent = new Agent({ headersTimeout: 0, bodyTimeout: 0, connections: 256 });
const outcomes = new Map<RunKey, Outcome>();
const scenarioStart = performance.now();
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** The YAML file: one pool, one engine at the cap, and the two tenants where the run has them. */
function configText(engineUrl: string, tenants: boolean): string {
  return [
    ...(tenants
      ? [
          'tenants:',
          '  - name: heavy',
          `    apiKeys: [${KEYS.heavy}]`,
          '  - name: light',
          `    apiKeys: [${KEYS.light}]`,
        ]
      : []),
    'pools:',
    `  - name: ${POOL}`,
    `    models: [${MODEL}]`,
    '    queueDepth: 1000',
    '    engines:',
    `      - { url: "${engineUrl}", name: e, maxInflight: ${CAP} }`,
    '',
  ].join('\n');
}

/** A short chat prompt, numbered so that no two share a prefix-cache block. */
const body = (tenant: Tenant, i: number) =>
  JSON.stringify({
    model: MODEL,
    messages: [{ role: 'user', content: `${tenant} ${i}: say something short.` }],
    max_tokens: MAX_TOKENS,
    stream: true,
  });

async function send(target: string, payload: string, key: string | undefined, record: Sent) {
  const tail = await timedChat(
    target,
    payload,
    key ? { authorization: `Bearer ${key}` } : {},
    agent,
    record,
  );
  if (tail !== undefined)
    record.complete = record.status === 200 && tail.endsWith('data: [DONE]\n\n');
}

async function runOnce(key: RunKey): Promise<Outcome> {
  const run = runs[key];
  const wallStart = performance.now();
  const stops: Array<() => Promise<unknown>> = [];
  const dir = mkdtempSync(join(tmpdir(), 'sluice-bench-fairness-'));
  stops.push(async () => rmSync(dir, { recursive: true, force: true }));
  try {
    const redis = await startRedis();
    stops.push(() => redis.stop());
    const engine = await startEngineSim([
      '--profile',
      'instant',
      '--model',
      MODEL,
      '--decode-seconds-per-sequence',
      String(DECODE_SECONDS),
    ]);
    stops.push(() => engine.stop());
    const config = join(dir, 'sluice.yaml');
    writeFileSync(config, configText(engine.url, run.tenants));
    const env = {
      REDIS_URL: redis.url,
      SLUICE_CONFIG: config,
      // Degradation would shorten answers under load and so change the workload between runs.
      SLUICE_DEGRADATION: 'off',
    };
    const processes: SluiceProcess[] = [await startDispatcher(env)];
    for (let i = 0; i < GATEWAYS; i += 1)
      processes.push(await startGateway(env, { keepOutput: false }));
    stops.push(() => Promise.all(processes.map((p) => p.stop())));
    const targets = processes.slice(1).map((g) => g.url);
    for (const target of targets)
      await eventually(async () => (await fetch(`${target}/readyz`)).ok || undefined, 'ready');
    const client = new Redis(redis.url);
    stops.push(() => client.quit());
    await client.ping();

    const keyOf = (tenant: Tenant) => (run.tenants ? KEYS[tenant] : undefined);
    // One request per replica and tenant: connections open, the path works end to end.
    for (const target of targets)
      for (const tenant of ['light', 'heavy'] as const) {
        const warm: Sent = { tenant, sentAt: performance.now() };
        await send(target, body(tenant, -1), keyOf(tenant), warm);
        if (!warm.complete) throw new Error(`${key}: warm-up through ${target} failed`);
      }
    await fetch(`${engine.url}/sim/peak/reset`, { method: 'POST' });

    const sent: Sent[] = [];
    let next = 0;
    const target = () => targets[next++ % targets.length]!;
    const start = performance.now();
    const queueSeries: Array<[number, number]> = [];
    let sampling = true;
    const sampler = (async () => {
      while (sampling) {
        const at = performance.now();
        const queued = await queuedJobs(client, 'sluice', POOL);
        queueSeries.push([round((performance.now() - start) / 1000, 2), queued]);
        await sleep(Math.max(0, SAMPLE_MS - (performance.now() - at)));
      }
    })();

    // Heavy's closed loop, until light is done.
    let flooding = run.heavy;
    let heavyIndex = 0;
    const workers = run.heavy
      ? Array.from({ length: HEAVY_BACKLOG }, async () => {
          while (flooding) {
            const record: Sent = { tenant: 'heavy', sentAt: performance.now() };
            sent.push(record);
            await send(target(), body('heavy', heavyIndex++), keyOf('heavy'), record);
            // A refusal (none expected: no tenant bound, depth 1,000) must not spin the loop.
            if (!record.complete) await sleep(100);
          }
        })
      : [];
    // Light starts in heavy's steady state: the loop has turned over once (as many answers as
    // workers), so its backlog sits in front of the engine. Counted at the client, whatever
    // the broker's queue layout.
    if (run.heavy)
      await eventually(
        () =>
          sent.filter((s) => s.tenant === 'heavy' && s.complete).length >= HEAVY_BACKLOG ||
          undefined,
        "heavy's loop turned over",
      );

    const windowStart = performance.now();
    const lightCount = Math.round((LIGHT_SECONDS * 1000) / LIGHT_EVERY_MS);
    const light = Array.from({ length: lightCount }, async (_, i) => {
      await sleep(Math.max(0, windowStart + i * LIGHT_EVERY_MS - performance.now()));
      const record: Sent = { tenant: 'light', sentAt: performance.now() };
      sent.push(record);
      await send(target(), body('light', i), keyOf('light'), record);
    });
    await Promise.all(light);
    const windowEnd = performance.now();
    flooding = false;
    await Promise.all(workers);
    sampling = false;
    await sampler;
    const state = await engine.state();
    return {
      sent,
      windowStart,
      windowEnd,
      peakRequests: state.peakRequests,
      queueSeries,
      wallSeconds: (performance.now() - wallStart) / 1000,
    };
  } finally {
    for (const stop of stops.reverse()) await stop();
  }
}

/** What the figures and findings are made of; TTFT in ms. */
function statsOf(o: Outcome) {
  const light = o.sent.filter((s) => s.tenant === 'light');
  const heavy = o.sent.filter((s) => s.tenant === 'heavy');
  const ttft = light
    .filter((s) => s.firstTokenAt !== undefined && s.status === 200)
    .map((s) => s.firstTokenAt! - s.sentAt);
  const window = (o.windowEnd - o.windowStart) / 1000;
  const servedInWindow = (list: Sent[]) =>
    list.filter((s) => s.complete && s.doneAt! >= o.windowStart && s.doneAt! <= o.windowEnd).length;
  return {
    ...summarize(ttft),
    p90: quantile(
      [...ttft].sort((a, b) => a - b),
      0.9,
    ),
    ttft,
    answered: ttft.length,
    light: light.length,
    lightRate: servedInWindow(light) / window,
    heavy: heavy.length,
    heavyRate: servedInWindow(heavy) / window,
    window,
    failed: o.sent.filter((s) => !s.complete).length,
    peakQueue: Math.max(0, ...o.queueSeries.map((p) => p[1])),
  };
}

const ratio = (a: RunKey, b: RunKey) => {
  const x = outcomes.get(a);
  const y = outcomes.get(b);
  return x && y ? statsOf(x).p99 / statsOf(y).p99 : undefined;
};

function figuresOf(key: RunKey, o: Outcome): Figure[] {
  const label = runs[key].label;
  const s = statsOf(o);
  const figures: Figure[] = [
    {
      name: `${label}: light TTFT p50`,
      value: round(s.p50, 1),
      unit: 'ms',
      note: `${s.answered} of ${s.light} light streams; first \`data:\` line at the client`,
    },
    { name: `${label}: light TTFT p90`, value: round(s.p90, 1), unit: 'ms' },
    { name: `${label}: light TTFT p99`, value: round(s.p99, 1), unit: 'ms' },
  ];
  const vsAlone = key === 'alone' ? undefined : ratio(key, 'alone');
  if (vsAlone !== undefined)
    figures.push({
      name: `${label}: light TTFT p99 / alone`,
      value: round(vsAlone, 2),
      unit: 'x',
      note: `light's p99 here over its p99 alone`,
    });
  const vsFair = key === 'fifo' ? ratio('fifo', 'fair') : undefined;
  if (vsFair !== undefined)
    figures.push({
      name: `${label}: light TTFT p99 / fair share`,
      value: round(vsFair, 2),
      unit: 'x',
      note: `light's p99 without fair share over its p99 with it`,
    });
  figures.push({
    name: `${label}: light served`,
    value: round(s.lightRate, 1),
    unit: 'req/s',
    note: `answers completed while light was sending (${round(s.window, 1)} s)`,
  });
  if (runs[key].heavy)
    figures.push(
      {
        name: `${label}: heavy served`,
        value: round(s.heavyRate, 1),
        unit: 'req/s',
        note: 'heavy answers completed in the same window',
      },
      {
        name: `${label}: peak queue`,
        value: s.peakQueue,
        unit: 'requests',
        note: `light and heavy requests queued in Redis, sampled every ${SAMPLE_MS} ms`,
      },
    );
  figures.push(
    {
      name: `${label}: peak engine running + waiting`,
      value: o.peakRequests,
      unit: 'requests',
      goal: `<= ${CAP} (the cap)`,
      met: o.peakRequests <= CAP,
      note: 'the simulator high-water mark, reset after warm-up',
    },
    {
      name: `${label}: failed or incomplete`,
      value: s.failed,
      unit: 'requests',
      note: `of ${s.light + s.heavy} sent`,
    },
  );
  return figures;
}

function findingsOf(): string[] {
  const got = (k: RunKey) => (outcomes.has(k) ? statsOf(outcomes.get(k)!) : undefined);
  const [alone, fair, fifo] = RUNS.map(got);
  const ms = (v: number) => `${round(v, 1)} ms`;
  const out: string[] = [];
  if (alone && fair)
    out.push(
      `With heavy flooding and fair share, light's TTFT is ${ms(fair.p50)} p50, ${ms(fair.p90)} p90 and ${ms(fair.p99)} p99, against ${ms(alone.p50)}, ${ms(alone.p90)} and ${ms(alone.p99)} alone (p99 ${round(fair.p99 / alone.p99, 2)}x alone's): most light requests wait only for the next free slot of the saturated engine, not behind heavy's backlog of ~${HEAVY_BACKLOG - CAP}.`,
    );
  if (fair && fifo) {
    // A light request that waited at least half of FIFO's median waited as if behind the backlog.
    const line = fifo.p50 / 2;
    const stalled = fair.ttft.filter((t) => t >= line).length;
    out.push(
      stalled === 0
        ? `With fair share no light request waited as long as half of FIFO's median (${ms(line)}).`
        : `Fair share's tail: ${stalled} of ${fair.answered} light requests waited ${ms(line)} or more (half of FIFO's median), that is, about as if queued behind heavy's backlog; they come in bursts of consecutive requests (the chart of light TTFT by send time), so the fair share was not applied for a few hundred milliseconds at a time. That tail is what sets the p99.`,
    );
  }
  if (fair && fifo)
    out.push(
      `Without tenants (FIFO) the same load gives light a TTFT p99 of ${ms(fifo.p99)} (p50 ${ms(fifo.p50)}), ${round(fifo.p99 / fair.p99, 1)}x its p99 with fair share: each light request waits behind every heavy request queued before it.`,
    );
  if (fair && fifo)
    out.push(
      `Fair share does not waste the engine: heavy was served ${round(fair.heavyRate, 1)} req/s with fair share and ${round(fifo.heavyRate, 1)} req/s under FIFO (light ${round(fair.lightRate, 1)} and ${round(fifo.lightRate, 1)} req/s), with the engine at most ${Math.max(outcomes.get('fair')!.peakRequests, outcomes.get('fifo')!.peakRequests)} requests (cap ${CAP}).`,
    );
  const missing = RUNS.filter((k) => !outcomes.has(k));
  if (missing.length > 0)
    out.push(`Not measured (the run failed or was not selected): ${missing.join(', ')}.`);
  return out;
}

function writeFairness(): void {
  const done = RUNS.filter((k) => outcomes.has(k));
  if (done.length === 0) return;
  const series: Series[] = [];
  for (const k of done) {
    const o = outcomes.get(k)!;
    series.push({
      name: `light TTFT by send time: ${runs[k].label}`,
      unit: 'ms',
      points: o.sent
        .filter((s) => s.tenant === 'light' && s.firstTokenAt !== undefined)
        .map((s) => [
          round((s.sentAt - o.windowStart) / 1000, 2),
          round(s.firstTokenAt! - s.sentAt, 1),
        ]),
    });
  }
  for (const k of done.filter((k) => runs[k].heavy))
    series.push({
      name: `queue in front of the engine: ${runs[k].label}`,
      unit: 'requests',
      points: outcomes.get(k)!.queueSeries,
    });
  writeResult({
    scenario: 'fairness',
    title: 'Fairness: a light tenant beside a 10x heavier one, with and without fair share',
    figures: done.flatMap((k) => figuresOf(k, outcomes.get(k)!)),
    findings: findingsOf(),
    series,
    notes: [
      `Engine: the simulator's instant profile (no prefill cost) with --decode-seconds-per-sequence ${DECODE_SECONDS}: a step with 4 sequences decoding takes ${round(4 * DECODE_SECONDS * 1000, 1)} ms, a ${MAX_TOKENS}-token answer ~${round(60 * DECODE_SECONDS * 1000)} ms at the cap. Cap ${CAP} (the pool's one engine, maxInflight ${CAP}), one dispatcher, ${GATEWAYS} gateways, queue depth 1,000, degradation off; fresh Redis, simulator and Sluice processes for each run.`,
      `Light: a streaming chat request (max_tokens ${MAX_TOKENS}) every ${LIGHT_EVERY_MS} ms for ${LIGHT_SECONDS} s (${Math.round((LIGHT_SECONDS * 1000) / LIGHT_EVERY_MS)} requests). Heavy: the same requests from a closed loop of ${HEAVY_BACKLOG} workers (each sends its next request when its answer ends), started before light and stopped when light's last answer ends; light starts once heavy has had ${HEAVY_BACKLOG} answers (its loop turned over once). Requests go round-robin over the gateways.`,
      'Why a closed loop: it keeps a steady backlog of ~36 queued requests whatever the speed of this shared machine, where an open loop at 10x light rate would either leave the engine idle (no queue) or grow a queue with the length of the run; its throughput is what the engine gives it, comparable between the fair-share and FIFO runs.',
      'Runs: light alone and fair share with `tenants` (heavy and light, one API key each, weight 1, no maxQueued) in SLUICE_CONFIG; FIFO with the same file minus `tenants` (one anonymous tenant: FIFO within a priority). Fair share releases next from the tenant with the least weighted service (VTC: input tokens at release + 2x output tokens as they stream), so a light request queued behind heavy ones goes to the next free slot.',
      'TTFT: from sending the request to the first `data:` line of the stream (keep-alive comments excluded), client wall clock. Served rates count answers completed while light was sending. Peak engine concurrency is the simulator high-water mark of running + waiting (/sim/state peakRequests), reset after a warm-up request per gateway and tenant.',
      ...done.map(
        (k) =>
          `${runs[k].label}: ${round(outcomes.get(k)!.wallSeconds, 1)} s of wall clock including start-up.`,
      ),
    ],
  });
}

describe('fairness: a light tenant beside a heavy one', () => {
  afterAll(async () => {
    writeFairness();
    await agent.close();
    console.log(
      `fairness scenario: ${round((performance.now() - scenarioStart) / 1000, 1)} s of wall clock`,
    );
  });

  for (const key of RUNS)
    it(`${runs[key].words}: every request answered, the engine within the cap`, async () => {
      const outcome = await runOnce(key);
      outcomes.set(key, outcome);
      expect(outcome.sent.filter((s) => !s.complete).map((s) => s.error ?? s.status)).toEqual([]);
      expect(outcome.peakRequests).toBeLessThanOrEqual(CAP);
    });
});
