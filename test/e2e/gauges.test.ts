// The engine's own gauges tighten the gate: traffic that bypasses Sluice, KV pressure, and
// an engine whose /metrics goes away, with fail mode open and closed.
import { parseExposition, sampleValue } from '@sluice/engine-metrics';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  eventually,
  queuedJobs,
  type SluiceProcess,
  startDispatcher,
  startEngineSim,
  startGateway,
  startRedis,
  type TestEngineSim,
  type TestRedis,
} from '../support/index.ts';

let redis: TestRedis;
let sim: TestEngineSim;
let client: Redis;
const stacks: Record<
  'open' | 'closed',
  { gateway: SluiceProcess; dispatcher: SluiceProcess; prefix: string }
> = {} as never;

beforeAll(async () => {
  redis = await startRedis();
  // 2,000 blocks of 16 = 32,000 KV tokens; slow decode keeps streams alive until aborted.
  sim = await startEngineSim([
    '--profile',
    'instant',
    '--model',
    'm',
    '--max-num-seqs',
    '64',
    '--num-gpu-blocks',
    '2000',
    '--max-model-len',
    '32000',
    '--decode-seconds-per-sequence',
    '0.01',
  ]);
  const base = {
    REDIS_URL: redis.url,
    VLLM_URL: sim.url,
    VLLM_MODEL: 'm',
    ADMISSION_MAX_INFLIGHT: '4',
    ADMISSION_KV_THRESHOLD: '0.5',
    ENGINE_SCRAPE_INTERVAL_MS: '100',
    // Gauges count as stale past (failures + 1) x 100 ms: 2.1 s, so that a scrape delayed on
    // a loaded machine does not make them stale (and the gauge conditions skipped) mid-test:
    // 600 ms was not enough with two other suites on the machine's two cores.
    ENGINE_STALE_AFTER_FAILURES: '20',
    VLLM_MAX_QUEUE_DEPTH: '50',
  };
  for (const mode of ['open', 'closed'] as const) {
    // Two independent Sluice deployments on one Redis and one engine, told apart by prefix.
    const env = { ...base, ADMISSION_FAIL_MODE: mode, SLUICE_REDIS_PREFIX: `sluice-${mode}` };
    const dispatcher = await startDispatcher(env);
    stacks[mode] = { dispatcher, gateway: await startGateway(env), prefix: `sluice-${mode}` };
  }
  client = new Redis(redis.url);
});

afterAll(async () => {
  await client?.quit();
  for (const s of Object.values(stacks)) await Promise.all([s.gateway.stop(), s.dispatcher.stop()]);
  await sim?.stop();
  await redis?.stop();
});

async function dispatcherMetric(
  mode: 'open' | 'closed',
  name: string,
  labels: Record<string, string> = {},
) {
  const text = await (await fetch(`${stacks[mode].dispatcher.url}/metrics`)).text();
  return sampleValue(parseExposition(text), name, labels) ?? 0;
}

/** Resolves after the dispatcher has read the engine's /metrics `n` more times. */
async function scrapes(mode: 'open' | 'closed', n: number) {
  const start = await dispatcherMetric(mode, 'sluice_engine_last_scrape_timestamp_seconds');
  let seen = start;
  for (let i = 0; i < n; i += 1) {
    const before = seen;
    seen = await eventually(async () => {
      const t = await dispatcherMetric(mode, 'sluice_engine_last_scrape_timestamp_seconds');
      return t > before ? t : undefined;
    }, 'a new scrape');
  }
}

const queued = (mode: 'open' | 'closed') => queuedJobs(client, stacks[mode].prefix);

function stream(
  base: string,
  content: string,
  extra: Record<string, unknown>,
  signal: AbortSignal,
) {
  return fetch(`${base}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({
      model: 'm',
      messages: [{ role: 'user', content }],
      stream: true,
      max_tokens: 30_000,
      ignore_eos: true,
      ...extra,
    }),
    signal,
  });
}

async function running(n: number) {
  await eventually(
    async () => ((await sim.state()).running === n ? true : undefined),
    `${n} sequences on the engine`,
  );
}

describe('engine gauges in the gate', () => {
  it('holds back when traffic bypasses Sluice, so the engine stays at the cap of 4, and releases once it is gone', async () => {
    const direct = new AbortController();
    const viaSluice = new AbortController();
    try {
      // Two streams straight to the engine, which Sluice did not send.
      const bypass = await Promise.all(
        [0, 1].map((i) => stream(sim.url, `bypass ${i}`, {}, direct.signal)),
      );
      await Promise.all(bypass.map((r) => r.body!.getReader().read()));
      await eventually(
        async () =>
          (await dispatcherMetric('open', 'sluice_engine_bypass_requests')) === 2
            ? true
            : undefined,
        'the dispatcher to see the bypass traffic',
      );
      await fetch(`${sim.url}/sim/peak/reset`, { method: 'POST' });
      // Six through Sluice: only two fit beside the bypass traffic.
      const ours = [0, 1, 2, 3, 4, 5].map((i) =>
        stream(stacks.open.gateway.url, `ours ${i}`, {}, viaSluice.signal).catch(() => undefined),
      );
      await eventually(
        async () => ((await queued('open')) === 4 ? true : undefined),
        'four of ours to wait',
      );
      await running(4);
      await scrapes('open', 3); // several more looks at the engine change nothing
      expect((await sim.state()).running).toBe(4);
      expect(await queued('open')).toBe(4);
      expect((await sim.state()).peakRequests).toBeLessThanOrEqual(4);
      expect(
        await dispatcherMetric('open', 'sluice_gate_closed_total', { reason: 'engine_busy' }),
      ).toBeGreaterThanOrEqual(1);
      // The bypass traffic ends: within a scrape, two more of ours are released.
      direct.abort();
      await eventually(
        async () => ((await queued('open')) === 2 ? true : undefined),
        'two more of ours to be released',
      );
      await running(4);
      expect((await sim.state()).peakRequests).toBeLessThanOrEqual(4);
      void ours;
    } finally {
      direct.abort();
      viaSluice.abort();
      await running(0);
      await eventually(
        async () => ((await queued('open')) === 0 ? true : undefined),
        'the queue to empty',
      );
    }
  });

  it('closes the gate while KV usage is at or above ADMISSION_KV_THRESHOLD, and reopens when it falls', async () => {
    const long = new AbortController();
    try {
      // 17,000 prompt tokens of 32,000: 53 % of the cache, above the 50 % threshold.
      const big = await stream(
        stacks.open.gateway.url,
        'big prompt',
        { sim_prompt_tokens: 17_000, max_tokens: 10_000 },
        long.signal,
      );
      await big.body!.getReader().read();
      await eventually(
        async () =>
          (await dispatcherMetric('open', 'sluice_engine_kv_usage_ratio')) >= 0.5
            ? true
            : undefined,
        'the dispatcher to see the KV usage',
      );
      const small = fetch(`${stacks.open.gateway.url}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({
          model: 'm',
          messages: [{ role: 'user', content: 'small' }],
          max_tokens: 2,
        }),
      });
      await eventually(
        async () => ((await queued('open')) === 1 ? true : undefined),
        'the small request to wait',
      );
      await scrapes('open', 3);
      expect(await queued('open')).toBe(1); // in-flight 1 of 4, yet held back
      expect(
        await dispatcherMetric('open', 'sluice_gate_closed_total', { reason: 'kv_pressure' }),
      ).toBeGreaterThanOrEqual(1);
      long.abort();
      expect((await small).status).toBe(200);
    } finally {
      long.abort();
      await running(0);
    }
  });

  it('flips the engine to stale when /metrics fails; fail mode open keeps serving under the cap, closed holds everything until /metrics recovers', async () => {
    // Transitions counted so far (a scrape that timed out on a loaded machine counts too).
    const before = {
      open: await dispatcherMetric('open', 'sluice_engine_state_stale_total'),
      closed: await dispatcherMetric('closed', 'sluice_engine_state_stale_total'),
    };
    await sim.setFaults({ metrics: 'error' });
    try {
      for (const mode of ['open', 'closed'] as const)
        await eventually(
          async () =>
            (await dispatcherMetric(mode, 'sluice_engine_state_stale_total')) ===
              before[mode] + 1 && (await dispatcherMetric(mode, 'sluice_engine_up')) === 0
              ? true
              : undefined,
          `the ${mode} dispatcher to mark the engine stale`,
        );
      expect(await dispatcherMetric('open', 'sluice_engine_up')).toBe(0);
      const request = (mode: 'open' | 'closed') =>
        fetch(`${stacks[mode].gateway.url}/v1/chat/completions`, {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify({
            model: 'm',
            messages: [{ role: 'user', content: `while stale ${mode}` }],
            max_tokens: 2,
          }),
        });
      expect((await request('open')).status).toBe(200);
      const held = request('closed');
      await eventually(
        async () => ((await queued('closed')) === 1 ? true : undefined),
        'the closed-mode request to wait',
      );
      await eventually(
        async () =>
          (await dispatcherMetric('closed', 'sluice_gate_closed_total', {
            reason: 'engine_stale',
          })) >= 1
            ? true
            : undefined,
        'the closed gate to be counted with reason engine_stale',
      );
      await sim.setFaults({ metrics: 'ok' });
      expect((await held).status).toBe(200);
      expect(await dispatcherMetric('closed', 'sluice_engine_up')).toBe(1);
      // Counted once per transition, however many scrapes failed.
      expect(await dispatcherMetric('closed', 'sluice_engine_state_stale_total')).toBe(
        before.closed + 1,
      );
    } finally {
      await sim.setFaults({ metrics: 'ok' });
    }
  });
});
