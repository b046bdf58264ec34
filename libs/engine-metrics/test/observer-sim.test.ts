// The observer against the real engine simulator process (`sluice engine-sim`).
// Every wait is on an event: the observer's 'change', or the simulator's own state.
import { eventually, startEngineSim, type TestEngineSim } from '@sluice/test/support';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { EngineObserver, EngineObserverOptions, ObservedEngine } from '../src/index.js';
import { createEngineObserver } from '../src/index.js';
import { recordChanges, stateWhere } from './observer-helpers.js';

const MODEL = 'sim-model';
const BLOCKS = 1000;
const BLOCK_SIZE = 16;

let sim: TestEngineSim;
const observers: EngineObserver[] = [];

function observe(options: Partial<EngineObserverOptions> = {}): EngineObserver {
  const observer = createEngineObserver({
    name: 'sim',
    url: sim.url,
    intervalMs: 20,
    // Generous, so a busy machine does not turn a test about something else into a timeout.
    timeoutMs: 5_000,
    staleAfterFailures: 3,
    ...options,
  });
  observers.push(observer);
  return observer;
}

async function setFaults(patch: Record<string, unknown>): Promise<void> {
  const res = await sim.setFaults(patch);
  expect(res.status).toBe(200);
}

beforeAll(async () => {
  sim = await startEngineSim([
    '--model',
    MODEL,
    '--max-num-seqs',
    '2',
    '--num-gpu-blocks',
    String(BLOCKS),
    '--block-size',
    String(BLOCK_SIZE),
    '--max-model-len',
    '8192',
  ]);
});

afterEach(async () => {
  await Promise.all(observers.splice(0).map((o) => o.stop()));
  await setFaults({ metrics: 'ok', metricsDelayMs: 0 });
});

afterAll(async () => {
  await sim?.stop();
});

describe('EngineObserver against the engine simulator', () => {
  it('scrapes once inside start(): healthy with the engine numbers when start resolves', async () => {
    // Three long streams on a two-sequence engine: two run, one waits, for minutes
    // (7,000 tokens at about 20 a second; two of them fit the 16,000-token cache).
    const load = new AbortController();
    const request = () =>
      fetch(`${sim.url}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({
          model: MODEL,
          messages: [{ role: 'user', content: 'hold the line' }],
          stream: true,
          max_tokens: 7_000,
          ignore_eos: true,
          sim_prompt_tokens: 400,
        }),
        signal: load.signal,
      });
    const responses = await Promise.all([request(), request(), request()]);
    try {
      for (const res of responses) expect(res.status).toBe(200);
      const before = await eventually(async () => {
        const s = await sim.state();
        return s.running === 2 && s.waiting === 1 && s.kvUsage > 0 ? s : undefined;
      }, 'two running and one waiting');

      const observer = observe({ now: () => 1_700_000_000_123 });
      const changes = recordChanges(observer);
      expect(observer.state).toEqual({
        name: 'sim',
        health: 'unknown',
        consecutiveFailures: 0,
        degraded: false,
        staleTransitions: 0,
      });
      await observer.start();
      const after = await sim.state();

      const state = observer.state;
      expect(changes[0]).toBe(state);
      expect(state).toMatchObject({
        name: 'sim',
        health: 'healthy',
        scrapedAt: 1_700_000_000_123,
        consecutiveFailures: 0,
        degraded: false,
        staleTransitions: 0,
      });
      expect(state.lastError).toBeUndefined();
      expect(state.vllm).toMatchObject({
        running: 2,
        waiting: 1,
        kvMetric: 'vllm:kv_cache_usage_perc',
        kvCapacityTokens: BLOCKS * BLOCK_SIZE,
        ranks: 1,
        models: [MODEL],
      });
      expect(state.vllm?.maxNumSeqs).toBeUndefined(); // the simulator, like vLLM, exports none
      // KV usage only grows while the two sequences decode, so the scrape lies between.
      expect(state.vllm?.kvUsage).toBeGreaterThanOrEqual(before.kvUsage);
      expect(state.vllm?.kvUsage).toBeLessThanOrEqual(after.kvUsage);
      expect(Object.isFrozen(state)).toBe(true);

      load.abort();
      const idle = await stateWhere(
        observer,
        (s) => s.vllm?.running === 0 && s.vllm.waiting === 0 && s.vllm.kvUsage === 0,
        'an idle engine after the clients left',
      );
      expect(idle.health).toBe('healthy');
    } finally {
      load.abort();
    }
  });

  it('goes stale after staleAfterFailures HTTP 500s, counts the transition once, and recovers', async () => {
    const observer = observe({ staleAfterFailures: 3 });
    await observer.start();
    const healthy = observer.state;
    expect(healthy.health).toBe('healthy');
    const changes = recordChanges(observer);

    await setFaults({ metrics: 'error' });
    const stale = await stateWhere(observer, (s) => s.health === 'stale', 'health stale');
    expect(stale).toMatchObject({ consecutiveFailures: 3, staleTransitions: 1, degraded: false });
    expect(stale.lastError).toMatch(/^GET http:\/\/127\.0\.0\.1:\d+\/metrics: HTTP 500$/);
    // The last reading is kept, with the time it was taken, so its age is visible.
    expect(stale.vllm).toEqual(healthy.vllm);
    expect(stale.scrapedAt).toBe(healthy.scrapedAt);
    const failing = changes.filter((s) => s.consecutiveFailures > 0);
    expect(failing.map((s) => [s.consecutiveFailures, s.health])).toEqual([
      [1, 'healthy'],
      [2, 'healthy'],
      [3, 'stale'],
    ]);

    const still = await stateWhere(
      observer,
      (s) => s.consecutiveFailures >= 8,
      'eight failures in a row',
    );
    expect(still).toMatchObject({ health: 'stale', staleTransitions: 1 });
    expect(changes.filter((s) => s.health === 'stale').every((s) => s.staleTransitions === 1)).toBe(
      true,
    );

    await setFaults({ metrics: 'ok' });
    const recovered = await stateWhere(observer, (s) => s.health === 'healthy', 'recovery');
    expect(recovered).toMatchObject({ consecutiveFailures: 0, staleTransitions: 1 });
    expect(recovered.lastError).toBeUndefined();
    expect(recovered.scrapedAt).toBeGreaterThanOrEqual(healthy.scrapedAt!);

    await setFaults({ metrics: 'error' });
    const again = await stateWhere(observer, (s) => s.health === 'stale', 'stale again');
    expect(again.staleTransitions).toBe(2);
  });

  it('start-up self-check: a 200 that is not vLLM sets degraded, which clears once it is vLLM', async () => {
    await setFaults({ metrics: 'not-vllm' });
    const observer = observe({ staleAfterFailures: 2 });
    await observer.start();
    expect(observer.state).toMatchObject({
      health: 'unknown',
      degraded: true,
      consecutiveFailures: 1,
      staleTransitions: 0,
    });
    expect(observer.state.vllm).toBeUndefined();
    expect(observer.state.lastError).toMatch(
      /\/metrics: metrics do not look like vLLM: missing vllm:num_requests_running, .*no vllm: series at all/,
    );

    // It counts as a failure too: an engine that is not vLLM cannot be gated on.
    const stale = await stateWhere(observer, (s) => s.health === 'stale', 'stale');
    expect(stale).toMatchObject({ degraded: true, staleTransitions: 1 });

    await setFaults({ metrics: 'ok' });
    const fixed = await stateWhere(observer, (s) => s.health === 'healthy', 'healthy');
    expect(fixed.degraded).toBe(false);
    expect(fixed.vllm?.models).toEqual([MODEL]);
  });

  it('sets degraded when a healthy endpoint starts answering with other metrics', async () => {
    const observer = observe({ staleAfterFailures: 100 });
    await observer.start();
    expect(observer.state.degraded).toBe(false);
    await setFaults({ metrics: 'not-vllm' });
    const degraded = await stateWhere(observer, (s) => s.degraded, 'degraded');
    expect(degraded.health).toBe('healthy'); // 1 failure of 100
    await setFaults({ metrics: 'ok' });
    const back = await stateWhere(observer, (s) => !s.degraded, 'not degraded');
    expect(back).toMatchObject({ health: 'healthy', consecutiveFailures: 0 });
  });

  it('clears degraded when the engine stops answering: a 5xx is an outage, not "not vLLM"', async () => {
    await setFaults({ metrics: 'not-vllm' });
    const observer = observe({ staleAfterFailures: 100 });
    await observer.start();
    expect(observer.state.degraded).toBe(true);
    await setFaults({ metrics: 'error' });
    const failing = await stateWhere(observer, (s) => /HTTP 5\d\d$/.test(s.lastError ?? ''), '5xx');
    expect(failing).toMatchObject({ degraded: false, health: 'unknown' });
  });

  it('counts a scrape slower than timeoutMs as a failure', async () => {
    const observer = observe({ intervalMs: 20, timeoutMs: 500, staleAfterFailures: 2 });
    await observer.start();
    expect(observer.state.health).toBe('healthy');

    await setFaults({ metrics: 'slow', metricsDelayMs: 5_000 });
    const stale = await stateWhere(observer, (s) => s.health === 'stale', 'stale');
    expect(stale).toMatchObject({ consecutiveFailures: 2, staleTransitions: 1, degraded: false });
    expect(stale.lastError).toMatch(/\/metrics: (timed out after 500 ms|.*Headers Timeout)/);

    await setFaults({ metrics: 'ok', metricsDelayMs: 0 });
    const recovered = await stateWhere(observer, (s) => s.health === 'healthy', 'recovery');
    expect(recovered.consecutiveFailures).toBe(0);
  });

  it('takes a scrape slower than the interval by default: the deadline is not the interval', async () => {
    const observer = createEngineObserver({
      name: 'sim',
      url: sim.url,
      intervalMs: 50,
      staleAfterFailures: 2,
    });
    observers.push(observer);
    await setFaults({ metrics: 'slow', metricsDelayMs: 300 });
    try {
      await observer.start();
      // Scrapes of 300 ms at a 50 ms interval: the first is taken, and so is the next.
      expect(observer.state).toMatchObject({ health: 'healthy', consecutiveFailures: 0 });
      const first = observer.state.scrapedAt!;
      const next = await stateWhere(observer, (s) => s.scrapedAt! > first, 'the next scrape');
      expect(next).toMatchObject({ health: 'healthy', consecutiveFailures: 0 });
    } finally {
      await setFaults({ metrics: 'ok', metricsDelayMs: 0 });
    }
  });

  it('cannot be started again after stop(); a second stop() is a no-op', async () => {
    const observer = observe();
    await observer.start();
    await observer.stop();
    await expect(observer.start()).rejects.toThrow(/observer sim was stopped/);
    await observer.stop();
  });
});

describe('EngineObserver against an older engine (--legacy-kv-metric)', () => {
  let legacy: TestEngineSim;
  beforeAll(async () => {
    legacy = await startEngineSim(['--legacy-kv-metric']);
  });
  afterAll(async () => {
    await legacy?.stop();
  });

  it('reads KV usage from vllm:gpu_cache_usage_perc', async () => {
    expect(await legacy.metricsText()).toContain('vllm:gpu_cache_usage_perc{');
    const observer = createEngineObserver({
      name: 'legacy',
      url: legacy.url,
      intervalMs: 50,
      timeoutMs: 5_000,
      staleAfterFailures: 3,
    });
    try {
      await observer.start();
      const state: ObservedEngine = observer.state;
      expect(state.health).toBe('healthy');
      expect(state.vllm).toMatchObject({
        running: 0,
        waiting: 0,
        kvUsage: 0,
        kvMetric: 'vllm:gpu_cache_usage_perc',
        ranks: 1,
      });
    } finally {
      await observer.stop();
    }
  });
});
