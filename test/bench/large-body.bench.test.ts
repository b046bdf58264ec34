// Large prompts through the whole stack: a body carried raw in a Redis key of its own (the
// default from SLUICE_BODY_KEY_MIN_BYTES = 64 KiB) against base64 inside BullMQ's job data
// (the same stack with the threshold above every size). Two stacks side by side, requests one
// at a time, alternated in rounds so both see the same machine; CPU per request per process
// from /proc, latency to the whole answer.
import { performance } from 'node:perf_hooks';
import { Agent, request } from 'undici';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { startStack, type Stack } from '../support/index.ts';
import { cpuSeconds, round, summarize, writeResult, type Figure } from './results.ts';

const SIZES = [256 * 1024, 1024 * 1024];
const ROUNDS = 4;
const PER_ROUND = 15;
const WARM_UP = 5;

const ways = [
  { name: 'key of its own', env: {} },
  // Above MAX_BODY_BYTES: every body goes as base64 in the job, as before.
  { name: 'base64 in the job', env: { SLUICE_BODY_KEY_MIN_BYTES: String(8 * 1024 * 1024) } },
] as const;

const stacks: Stack[] = [];
const agent = new Agent({ connections: 1 });

beforeAll(async () => {
  for (const way of ways)
    stacks.push(
      await startStack({
        keepGatewayOutput: false,
        env: { MAX_BODY_BYTES: String(2 * 1024 * 1024), ADMISSION_MAX_INFLIGHT: '4', ...way.env },
      }),
    );
}, 120_000);

afterAll(async () => {
  await agent.close();
  await Promise.all(stacks.map((s) => s.stop()));
});

/** A chat body of `bytes` bytes: mixed text with quotes, newlines and non-ASCII. */
function chatBody(bytes: number): string {
  const unit = 'the caf\u00e9 says "hi"\n and \u4e2d\u6587 ';
  const shell = (content: string) =>
    JSON.stringify({
      model: 'm',
      messages: [{ role: 'user', content }],
      max_tokens: 4,
      // The simulator's prefill stays short: the figures are the broker's, not the engine's.
      sim_prompt_tokens: 100,
    });
  // Escapes make the JSON longer than its text: scale the text to fit, then trim the rest.
  const perUnit = Buffer.byteLength(shell(unit.repeat(1000))) / 1000;
  let content = unit.repeat(Math.floor(bytes / perUnit));
  content += 'x'.repeat(Math.max(0, bytes - Buffer.byteLength(shell(content))));
  return shell(content);
}

async function once(url: string, body: string): Promise<number> {
  const start = performance.now();
  const res = await request(`${url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body,
    dispatcher: agent,
  });
  const text = await res.body.text();
  if (res.statusCode !== 200) throw new Error(`HTTP ${res.statusCode}: ${text}`);
  return performance.now() - start;
}

const processes = (stack: Stack) => ({
  gateway: stack.gateway.process.child.pid!,
  dispatcher: stack.dispatcher.process.child.pid!,
  redis: stack.redis.process.child.pid!,
});

it('measures a large body in a key of its own against base64 in the job', async () => {
  const figures: Figure[] = [];
  const rows: string[][] = [];
  for (const size of SIZES) {
    const body = chatBody(size);
    const latencies = ways.map(() => [] as number[]);
    const cpu = ways.map(() => ({ gateway: 0, dispatcher: 0, redis: 0 }));
    for (const stack of stacks)
      for (let i = 0; i < WARM_UP; i += 1) await once(stack.gateway.url, body);
    for (let round = 0; round < ROUNDS; round += 1) {
      for (const [w, stack] of stacks.entries()) {
        const pids = processes(stack);
        const before = Object.values(pids).map(cpuSeconds);
        for (let i = 0; i < PER_ROUND; i += 1)
          latencies[w]!.push(await once(stack.gateway.url, body));
        Object.values(pids).forEach((pid, i) => {
          const name = Object.keys(pids)[i] as keyof (typeof cpu)[number];
          cpu[w]![name] += cpuSeconds(pid) - before[i]!;
        });
      }
    }
    const n = ROUNDS * PER_ROUND;
    const kib = `${size / 1024} KiB`;
    ways.forEach((way, w) => {
      const ms = (s: number) => round((s * 1000) / n, 2);
      const used = cpu[w]!;
      const p50 = round(summarize(latencies[w]!).p50, 2);
      figures.push(
        { name: `${kib}, ${way.name}: p50 to the whole answer`, value: p50, unit: 'ms' },
        {
          name: `${kib}, ${way.name}: gateway CPU per request`,
          value: ms(used.gateway),
          unit: 'ms',
        },
        {
          name: `${kib}, ${way.name}: dispatcher CPU per request`,
          value: ms(used.dispatcher),
          unit: 'ms',
        },
        { name: `${kib}, ${way.name}: Redis CPU per request`, value: ms(used.redis), unit: 'ms' },
      );
      rows.push([
        kib,
        way.name,
        String(p50),
        String(ms(used.gateway)),
        String(ms(used.dispatcher)),
        String(ms(used.redis)),
      ]);
    });
  }
  expect(figures.every((f) => Number.isFinite(f.value) && f.value >= 0)).toBe(true);
  writeResult({
    scenario: 'large-body',
    title: 'Large prompts: raw in a key of their own against base64 in the job',
    figures,
    tables: [
      {
        title: 'Per request, one at a time (medians of latency; CPU summed over the requests)',
        head: [
          'Body',
          'Carried as',
          'p50 (ms)',
          'Gateway CPU (ms)',
          'Dispatcher CPU (ms)',
          'Redis CPU (ms)',
        ],
        rows,
      },
    ],
    notes: [
      `Two stacks side by side, ${ROUNDS} rounds of ${PER_ROUND} requests each, alternated; ${WARM_UP} warm-up requests per stack and size. Instant engine simulator, 4 tokens out, its prefill fixed at 100 tokens.`,
      'CPU from /proc in clock ticks (10 ms) summed over the requests, so each figure is good to about 0.2 ms.',
    ],
  });
}, 600_000);
