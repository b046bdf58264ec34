// Relay: many concurrent streams, each producing tokens at a realistic rate, straight from the
// engine and through Sluice: chunks per second delivered, and the inter-token latency the
// client sees (the gap between consecutive `data:` events at the client).
import { performance } from 'node:perf_hooks';
import { Redis } from 'ioredis';
import { Agent, request } from 'undici';
import { afterAll, beforeAll, expect, it } from 'vitest';
import {
  startStack,
  type SluiceProcess,
  type Stack,
  type TestEngineSim,
  type TestRedis,
} from '../support/index.ts';
import { cpuSeconds, round, summarize, writeResult, type Figure, type Series } from './results.ts';

const STREAMS = 256;
const TOKENS = 360;
// Every running sequence shares each step: 25 ms + 256 x 0.02 ms = ~30 ms per step, so each of
// the 256 streams gets ~33 tokens/s, and a stream lasts ~11 s. The fixed part dominates, so a
// stream's pace hardly depends on how many others have started yet.
const STEP_OVERHEAD_SECONDS = 0.025;
const DECODE_SECONDS_PER_SEQUENCE = 0.00002;

let stack: Stack;
let redis: TestRedis;
let sim: TestEngineSim;
let dispatcher: SluiceProcess;
let gateway: SluiceProcess;

beforeAll(async () => {
  stack = await startStack({
    keepGatewayOutput: false,
    sim: [
      ...['--max-num-seqs', String(STREAMS)],
      ...['--step-overhead-seconds', String(STEP_OVERHEAD_SECONDS)],
      ...['--decode-seconds-per-sequence', String(DECODE_SECONDS_PER_SEQUENCE)],
    ],
    env: { ADMISSION_MAX_INFLIGHT: String(STREAMS), VLLM_MAX_QUEUE_DEPTH: String(STREAMS * 4) },
  });
  ({ redis, sim, dispatcher, gateway } = stack);
});

afterAll(() => stack?.stop());

/** One stream: the arrival time (ms since `origin`) of each of its token events. */
async function stream(agent: Agent, url: string, i: number, origin: number): Promise<number[]> {
  const res = await request(`${url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({
      model: 'm',
      messages: [{ role: 'user', content: `Tell story number ${i}.` }],
      max_tokens: TOKENS,
      ignore_eos: true,
      stream: true,
    }),
    dispatcher: agent,
  });
  if (res.statusCode !== 200) throw new Error(`${url}: HTTP ${res.statusCode}`);
  res.body.setEncoding('utf8');
  const arrivals: number[] = [];
  let carry = '';
  let done = false;
  for await (const chunk of res.body as AsyncIterable<string>) {
    const now = performance.now() - origin;
    const events = (carry + chunk).split('\n\n');
    carry = events.pop()!;
    for (const event of events) {
      if (event === 'data: [DONE]') done = true;
      else if (event.startsWith('data: ')) arrivals.push(now);
    }
  }
  if (!done) throw new Error(`${url}: stream ${i} ended without [DONE]`);
  return arrivals;
}

/**
 * All streams at once against `url`. The rate and the gaps are taken over the window in which
 * every stream is running (from the last first token to the first last token), or over the whole
 * run where the streams never all ran together.
 */
async function run(url: string) {
  const agent = new Agent({ connections: STREAMS });
  const origin = performance.now();
  const streams = await Promise.all(
    Array.from({ length: STREAMS }, (_, i) => stream(agent, url, i, origin)),
  );
  await agent.close();
  const allStarted = Math.max(...streams.map((a) => a[0]!));
  const firstDone = Math.min(...streams.map((a) => a.at(-1)!));
  const overlap = firstDone - allStarted > 1000;
  const [from, to] = overlap
    ? [allStarted, firstDone]
    : [0, Math.max(...streams.map((a) => a.at(-1)!))];
  const gaps: number[] = [];
  const perSecond: number[] = [];
  let inWindow = 0;
  for (const arrivals of streams) {
    arrivals.forEach((t, k) => {
      if (t >= from && t <= to) inWindow += 1;
      if (k > 0 && arrivals[k - 1]! >= from && t <= to) gaps.push(t - arrivals[k - 1]!);
      const second = Math.floor(t / 1000);
      perSecond[second] = (perSecond[second] ?? 0) + 1;
    });
  }
  return {
    chunks: streams.reduce((sum, a) => sum + a.length, 0),
    minChunks: Math.min(...streams.map((a) => a.length)),
    allStarted: allStarted / 1000,
    overlap,
    window: (to - from) / 1000,
    rate: inWindow / ((to - from) / 1000),
    gaps: summarize(gaps),
    points: [...perSecond].map((n, s): [number, number] => [s, n ?? 0]),
  };
}

/** PUBLISH commands Redis has run so far (INFO commandstats). */
async function publishCalls(client: Redis): Promise<number> {
  return Number(/^cmdstat_publish:calls=(\d+)/m.exec(await client.info('commandstats'))?.[1] ?? 0);
}

/** Reply frames the dispatcher has published so far, from its own metrics. */
async function relayFrames(): Promise<number> {
  const text = await (await fetch(`${dispatcher.url}/metrics`)).text();
  let frames = 0;
  for (const m of text.matchAll(/^sluice_relay_frames_total\{[^}]*\} (\d+)/gm))
    frames += Number(m[1]);
  return frames;
}

it('relays 256 concurrent token streams, against the engine straight', async () => {
  const direct = await run(sim.url);
  const pids = [
    gateway.process.child.pid!,
    dispatcher.process.child.pid!,
    redis.process.child.pid!,
  ];
  const cpuBefore = pids.map(cpuSeconds);
  const client = new Redis(redis.url);
  const publishesBefore = await publishCalls(client);
  const framesBefore = await relayFrames();
  const start = performance.now();
  const sluice = await run(gateway.url);
  const seconds = (performance.now() - start) / 1000;
  const [gatewayCpu, dispatcherCpu, redisCpu] = pids.map(
    (pid, i) => cpuSeconds(pid) - cpuBefore[i]!,
  );
  const framesPerPublish =
    ((await relayFrames()) - framesBefore) / ((await publishCalls(client)) - publishesBefore);
  await client.quit();
  expect(sluice.minChunks, 'every stream delivered every token').toBeGreaterThanOrEqual(TOKENS);
  expect(sluice.chunks).toBe(direct.chunks);

  const ms = (name: string, value: number): Figure => ({ name, value: round(value), unit: 'ms' });
  const figures: Figure[] = [
    { name: 'chunks per second, direct', value: round(direct.rate, 0), unit: 'chunks/s' },
    { name: 'chunks per second, Sluice', value: round(sluice.rate, 0), unit: 'chunks/s' },
    {
      name: 'tokens per second per stream, direct',
      value: round(direct.rate / STREAMS, 1),
      unit: 'tokens/s',
    },
    {
      name: 'tokens per second per stream, Sluice',
      value: round(sluice.rate / STREAMS, 1),
      unit: 'tokens/s',
    },
    {
      name: 'time until every stream had its first token, direct',
      value: round(direct.allStarted, 2),
      unit: 's',
    },
    {
      name: 'time until every stream had its first token, Sluice',
      value: round(sluice.allStarted, 2),
      unit: 's',
    },
    { name: 'window with every stream running, direct', value: round(direct.window, 1), unit: 's' },
    { name: 'window with every stream running, Sluice', value: round(sluice.window, 1), unit: 's' },
    ms('inter-token latency p50, direct', direct.gaps.p50),
    ms('inter-token latency p99, direct', direct.gaps.p99),
    ms('inter-token latency p50, Sluice', sluice.gaps.p50),
    ms('inter-token latency p99, Sluice', sluice.gaps.p99),
    ms('added inter-token latency p50', sluice.gaps.p50 - direct.gaps.p50),
    ms('added inter-token latency p99', sluice.gaps.p99 - direct.gaps.p99),
    {
      name: 'gateway CPU while relaying',
      value: round((gatewayCpu! / seconds) * 100, 0),
      unit: '% of a core',
    },
    {
      name: 'dispatcher CPU while relaying',
      value: round((dispatcherCpu! / seconds) * 100, 0),
      unit: '% of a core',
    },
    {
      name: 'Redis CPU while relaying',
      value: round((redisCpu! / seconds) * 100, 0),
      unit: '% of a core',
    },
    {
      name: 'reply frames per PUBLISH (one per gateway replica and turn of the event loop)',
      value: round(framesPerPublish, 1),
      unit: 'frames',
    },
  ];
  const series: Series[] = [
    { name: 'chunks per second, direct', unit: 'chunks/s', points: direct.points },
    { name: 'chunks per second, Sluice', unit: 'chunks/s', points: sluice.points },
  ];
  writeResult({
    scenario: 'relay',
    title: `Relay: ${STREAMS} concurrent streams, direct against through Sluice`,
    figures,
    series,
    notes: [
      `${STREAMS} streams of ${TOKENS} tokens (ignore_eos) started together, first straight to the engine, then through Sluice (cap ${STREAMS}). Simulator: instant profile with ${STEP_OVERHEAD_SECONDS * 1000} ms per step + ${DECODE_SECONDS_PER_SEQUENCE * 1000} ms per decoding sequence; all streams share each step, so every stream gets one token per step.`,
      'Inter-token latency is the gap between consecutive data: events of one stream at the client; events that arrive in one read count as a gap of 0, as the client sees them.',
      'Chunks per second and inter-token latency are taken over the window in which every stream is running (last first token to first last token); the series show the whole run.',
      ...[direct, sluice]
        .filter((r) => !r.overlap)
        .map(
          (r) =>
            `${r === direct ? 'Direct' : 'Sluice'}: the streams never all ran at once (the last started after the first ended), so its figures cover the whole run.`,
        ),
      'Gaps average the step time in both cases, so where Sluice shows a lower p50 and a higher p99 than direct, that is jitter in the relay: a late token is followed by an early one.',
    ],
  });
});
