// An engine's scrape as the dispatcher takes it in: what the prefill rules then read from the
// slot. Worked on a two-rank data-parallel vLLM server, whose ranks the API server fills by
// queue length, not by free KV.
import {
  gateDecision,
  releaseDecision,
  type GatePolicy,
  type LongPromptPolicy,
} from '@sluice/admission';
import type { EngineConfig } from '@sluice/config';
import { parseExposition, readVllmState, type ObservedEngine } from '@sluice/engine-metrics';
import { dispatcherMetrics, Registry } from '@sluice/observability';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { createEngineSlot, observeEngine, type ObservationDeps } from '../src/engine-slot.ts';
import { PrefillRate, trackRelease } from '../src/prefill-tracker.ts';

const NOW = 1_700_000_000_000;
const gate: GatePolicy = { kvThreshold: 0.9, failMode: 'open', maxGaugeAgeMs: 2000 };
const longPolicy: LongPromptPolicy = {
  thresholdTokens: 8192,
  maxShare: 0.5,
  maxInPrefill: 1,
  agingSeconds: 60,
  kvFit: true,
};

/**
 * Two ranks of 100,000 KV tokens (6,250 blocks of 16), each half full. Each rank shows the
 * front end's summed cache config, 12,500 blocks, as vLLM writes it (vllm/v1/engine/utils.py,
 * vllm/v1/metrics/loggers.py).
 */
function twoHalfFullRanks(): ObservedEngine {
  const lines = ['0', '1'].flatMap((rank) => [
    `vllm:num_requests_running{engine="${rank}",model_name="m"} 1.0`,
    `vllm:num_requests_waiting{engine="${rank}",model_name="m"} 0.0`,
    `vllm:kv_cache_usage_perc{engine="${rank}",model_name="m"} 0.5`,
    `vllm:cache_config_info{block_size="16",engine="${rank}",num_gpu_blocks="12500"} 1.0`,
  ]);
  return {
    name: 'e',
    health: 'healthy',
    vllm: readVllmState(parseExposition(lines.join('\n'))),
    scrapedAt: NOW,
    scrapeSentAt: NOW,
    consecutiveFailures: 0,
    degraded: false,
    staleTransitions: 0,
  };
}

function observedSlot(
  state: ObservedEngine,
  cap: Pick<EngineConfig, 'maxInflight' | 'capSource'> = { maxInflight: 8, capSource: 'config' },
  log: ObservationDeps['log'] = { info: () => {}, warn: () => {}, error: () => {} },
  capChanged: () => void = () => {},
) {
  const engine = createEngineSlot(
    { name: 'e', url: 'http://127.0.0.1:9', ...cap, lane: 'any' },
    {
      timeouts: { headersTimeoutMs: 1000, bodyTimeoutMs: 1000 },
      scrape: { intervalMs: 1000, staleAfterFailures: 3 },
      now: () => NOW,
    },
  );
  const deps: ObservationDeps = {
    pool: 'p',
    metrics: dispatcherMetrics(new Registry()),
    policy: gate,
    prefillRate: new PrefillRate(),
    log,
    capChanged,
    changed: () => {},
    onEngineBy: () => 0,
  };
  observeEngine(deps, engine, state);
  return engine;
}

describe('a data-parallel engine in the KV-fit rule', () => {
  it('fits a long prompt to one rank, not to the free KV of all ranks together', () => {
    const engine = observedSlot(twoHalfFullRanks());
    // 100,000 tokens are free over both ranks, but only 50,000 on either.
    const decide = (tokens: number) =>
      releaseDecision(engine, 'long', tokens, longPolicy, gate, NOW);
    expect(decide(80_000)).toEqual({ admit: false, reason: 'kv_fit' });
    expect(decide(50_000)).toEqual({ admit: true });
  });
});

/** One vLLM server whose metrics show its --max-num-seqs (some builds do; upstream shows none). */
function engineShowing(maxNumSeqs: number): ObservedEngine {
  const lines = [
    'vllm:num_requests_running{model_name="m"} 0.0',
    'vllm:num_requests_waiting{model_name="m"} 0.0',
    'vllm:kv_cache_usage_perc{model_name="m"} 0.0',
    `vllm:scheduler_config_info{max_num_seqs="${maxNumSeqs}",model_name="m"} 1.0`,
  ];
  return { ...twoHalfFullRanks(), vllm: readVllmState(parseExposition(lines.join('\n'))) };
}

describe("the cap and the engine's own max_num_seqs", () => {
  const logged = () => {
    const lines: string[] = [];
    return {
      lines,
      log: {
        info: (_o: object, m: string) => void lines.push(`info: ${m}`),
        warn: (_o: object, m: string) => void lines.push(`warn: ${m}`),
        error: (_o: object, m: string) => void lines.push(`error: ${m}`),
      },
    };
  };

  it('a cap nobody set follows the engine', () => {
    const { lines, log } = logged();
    let changes = 0;
    const engine = observedSlot(
      engineShowing(64),
      { maxInflight: 256, capSource: 'default' },
      log,
      () => (changes += 1),
    );
    expect(engine.cap).toBe(64);
    expect(changes).toBe(1);
    expect(lines).toEqual(["warn: cap set from the engine's max_num_seqs"]);
  });

  it('a cap set below the engine is kept, without a word (room left on purpose)', () => {
    const { lines, log } = logged();
    const engine = observedSlot(engineShowing(64), { maxInflight: 1, capSource: 'config' }, log);
    expect(engine.cap).toBe(1);
    expect(lines).toEqual([]);
  });

  it('a cap set above the engine is kept and said once per value the engine shows', () => {
    const { lines, log } = logged();
    const deps: ObservationDeps = {
      pool: 'p',
      metrics: dispatcherMetrics(new Registry()),
      policy: gate,
      prefillRate: new PrefillRate(),
      log,
      capChanged: () => {},
      changed: () => {},
      onEngineBy: () => 0,
    };
    const engine = observedSlot(
      engineShowing(64),
      { maxInflight: 128, capSource: 'ADMISSION_MAX_INFLIGHT' },
      log,
    );
    observeEngine(deps, engine, { ...engineShowing(64), scrapedAt: NOW + 1000 });
    observeEngine(deps, engine, { ...engineShowing(96), scrapedAt: NOW + 2000 });
    expect(engine.cap).toBe(128);
    expect(lines).toHaveLength(2);
    expect(lines[0]).toMatch(/^error: the cap set for this engine is above its max_num_seqs/);
  });
});

/** A request vLLM finished: its prompt, the part found in the prefix cache, its prefill time. */
interface Finished {
  prompt: number;
  cached: number;
  prefillSeconds: number;
}

/** prometheus_client's `floatToGoString`: Python's repr, exponent form past six digits. */
function goFloat(value: number): string {
  const text = Number.isInteger(value) ? `${value}.0` : String(value);
  const dot = text.indexOf('.');
  if (value <= 0 || dot <= 6) return text;
  const mantissa = `${text[0]}.${text.slice(1, dot)}${text.slice(dot + 1)}`.replace(/[0.]+$/, '');
  return `${mantissa}e+0${dot - 1}`;
}

/** vLLM's `build_1_2_5_buckets(max_model_len)` (vllm/v1/metrics/loggers.py), 131,072 here. */
const tokenBuckets = [
  1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10_000, 20_000, 50_000, 100_000,
];
/** `request_latency_buckets` of the same file. */
const latencyBuckets = [
  0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
  480.0, 960.0, 1920.0, 7680.0,
];
const MODEL = 'Qwen/Qwen3-32B';

function histogram(name: string, help: string, buckets: number[], values: number[]): string[] {
  const labels = `engine="0",model_name="${MODEL}"`;
  const count = (le: number) => values.filter((v) => v <= le).length;
  return [
    `# HELP ${name} ${help}`,
    `# TYPE ${name} histogram`,
    ...buckets.map(
      (le) =>
        `${name}_bucket{engine="0",le="${goFloat(le)}",model_name="${MODEL}"} ${goFloat(count(le))}`,
    ),
    `${name}_bucket{engine="0",le="+Inf",model_name="${MODEL}"} ${goFloat(values.length)}`,
    `${name}_count{${labels}} ${goFloat(values.length)}`,
    `${name}_sum{${labels}} ${goFloat(values.reduce((a, b) => a + b, 0))}`,
    `# HELP ${name}_created ${help}`,
    `# TYPE ${name}_created gauge`,
    `${name}_created{${labels}} 1.7659396541925035e+09`,
  ];
}

/**
 * The /metrics of a vLLM >= 0.13 server (one rank) that has finished `done`: the gauges, the
 * cache config and the three request histograms vllm/v1/metrics/loggers.py observes, in one
 * loop, for each finished request ("prefill_kv_computed = finished_request.num_prompt_tokens -
 * max(finished_request.num_cached_tokens, 0)").
 */
function vllmScrape(done: Finished[], at: number, computedTokens = true): ObservedEngine {
  const labels = `engine="0",model_name="${MODEL}"`;
  const lines = [
    '# HELP vllm:num_requests_running Number of requests in model execution batches.',
    '# TYPE vllm:num_requests_running gauge',
    `vllm:num_requests_running{${labels}} 1.0`,
    '# HELP vllm:num_requests_waiting Number of requests waiting to be processed.',
    '# TYPE vllm:num_requests_waiting gauge',
    `vllm:num_requests_waiting{${labels}} 0.0`,
    '# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.',
    '# TYPE vllm:kv_cache_usage_perc gauge',
    `vllm:kv_cache_usage_perc{${labels}} 0.1`,
    '# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig',
    '# TYPE vllm:cache_config_info gauge',
    `vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="0",num_gpu_blocks="20000"} 1.0`,
    ...histogram(
      'vllm:request_prompt_tokens',
      'Number of prefill tokens processed.',
      tokenBuckets,
      done.map((r) => r.prompt),
    ),
    ...histogram(
      'vllm:request_prefill_time_seconds',
      'Histogram of time spent in PREFILL phase for request.',
      latencyBuckets,
      done.map((r) => r.prefillSeconds),
    ),
    ...(computedTokens
      ? histogram(
          'vllm:request_prefill_kv_computed_tokens',
          'Histogram of new KV tokens computed during prefill (excluding cached tokens).',
          tokenBuckets,
          done.map((r) => r.prompt - Math.max(r.cached, 0)),
        )
      : []),
    '',
  ];
  return {
    name: 'e',
    health: 'healthy',
    vllm: readVllmState(parseExposition(lines.join('\n'))),
    scrapedAt: at,
    scrapeSentAt: at,
    consecutiveFailures: 0,
    degraded: false,
    staleTransitions: 0,
  };
}

describe("the engine's own prefill rate, with prefix caching", () => {
  afterEach(() => vi.useRealTimers());

  const earlier: Finished[] = [{ prompt: 4000, cached: 0, prefillSeconds: 1.2 }];
  // Between two scrapes, a cold 65,536-token prompt (the reference engine's 250 s of prefill)
  // and 40 turns of an agent's 64,000-token conversation, each but its last 512 tokens in
  // the prefix cache. Prompt tokens over prefill seconds: 2,625,536 / 254 = 10,337 tokens a
  // second; the engine computed 86,016 in those 254 s, 339 a second.
  const since: Finished[] = [
    { prompt: 65_536, cached: 0, prefillSeconds: 250 },
    ...Array.from({ length: 40 }, () => ({ prompt: 64_000, cached: 63_488, prefillSeconds: 0.1 })),
  ];

  function scrapedTwice(computedTokens: boolean) {
    const rate = new PrefillRate();
    const engine = createEngineSlot(
      { name: 'e', url: 'http://127.0.0.1:9', maxInflight: 8, capSource: 'config', lane: 'any' },
      {
        timeouts: { headersTimeoutMs: 1000, bodyTimeoutMs: 1000 },
        scrape: { intervalMs: 1000, staleAfterFailures: 3 },
        now: () => NOW,
      },
    );
    const deps: ObservationDeps = {
      pool: 'p',
      metrics: dispatcherMetrics(new Registry()),
      policy: gate,
      prefillRate: rate,
      log: { info: () => {}, warn: () => {}, error: () => {} },
      capChanged: () => {},
      changed: () => {},
      onEngineBy: () => 0,
    };
    observeEngine(deps, engine, vllmScrape(earlier, NOW, computedTokens));
    observeEngine(deps, engine, vllmScrape([...earlier, ...since], NOW + 1000, computedTokens));
    return { engine, rate };
  }

  it('reads the tokens the engine computed, not the prompt tokens the prefix cache served', () => {
    expect(scrapedTwice(true).rate.current).toBeCloseTo(86_016 / 254, 6);
  });

  it('keeps a cold long prompt released without a stream in prefill for its real prefill time', () => {
    vi.useFakeTimers();
    const { engine, rate } = scrapedTwice(true);
    const at = NOW + 2000;
    trackRelease(engine, {
      long: true,
      promptTokens: 65_536,
      stream: false,
      releasedAt: at,
      rate,
      changed: () => {},
    });
    // At 10,337 tokens a second it would leave prefill after 6 s, and a second long prompt
    // would start beside it; at the computed rate it prefills for 194 s.
    vi.advanceTimersByTime(60_000);
    expect(engine.longInPrefill).toBe(1);
    expect(releaseDecision(engine, 'long', 20_000, longPolicy, gate, at + 60_000)).toEqual({
      admit: false,
      reason: 'long_prefill',
    });
    vi.advanceTimersByTime(140_000);
    expect(engine.longInPrefill).toBe(0);
  });

  it('reads an older engine by its prompt tokens, and never differences the two kinds', () => {
    const older = scrapedTwice(false);
    expect(older.rate.current).toBeCloseTo(2_625_536 / 254, 6);
    expect(older.rate.engineValue).toBeUndefined();
    // The engine upgraded between two scrapes: the first difference would mix the two sums.
    const { engine, rate } = scrapedTwice(false);
    const deps: ObservationDeps = {
      pool: 'p',
      metrics: dispatcherMetrics(new Registry()),
      policy: gate,
      prefillRate: rate,
      log: { info: () => {}, warn: () => {}, error: () => {} },
      capChanged: () => {},
      changed: () => {},
      onEngineBy: () => 0,
    };
    observeEngine(deps, engine, vllmScrape(earlier, NOW + 2000, true));
    expect(rate.engineValue).toBeUndefined();
    observeEngine(deps, engine, vllmScrape([...earlier, ...since], NOW + 3000, true));
    expect(rate.engineValue).toBeCloseTo(86_016 / 254, 6);
    expect(rate.current).toBeCloseTo(86_016 / 254, 6);
  });
});

/** One scrape of a one-rank engine reading these gauges and this step counter, at `at`. */
function reading(
  at: number,
  { running = 4, waiting = 0, kv = 0.3, steps = 120 as number | undefined } = {},
): ObservedEngine {
  const lines = [
    `vllm:num_requests_running{engine="0",model_name="m"} ${running}`,
    `vllm:num_requests_waiting{engine="0",model_name="m"} ${waiting}`,
    `vllm:kv_cache_usage_perc{engine="0",model_name="m"} ${kv}`,
    ...(steps === undefined ? [] : [`vllm:iteration_tokens_total_count{engine="0"} ${steps}`]),
  ];
  return {
    name: 'e',
    health: 'healthy',
    vllm: readVllmState(parseExposition(lines.join('\n'))),
    scrapedAt: at,
    scrapeSentAt: at - 5,
    consecutiveFailures: 0,
    degraded: false,
    staleTransitions: 0,
  };
}

describe('frozen gauges: since when the engine has shown no progress', () => {
  const frozenGate: GatePolicy = { ...gate, frozenAfterMs: 1000 };

  function observing(policy: GatePolicy = frozenGate) {
    const lines: string[] = [];
    const metrics = dispatcherMetrics(new Registry());
    const engine = createEngineSlot(
      { name: 'e', url: 'http://127.0.0.1:9', maxInflight: 4, capSource: 'config', lane: 'any' },
      {
        timeouts: { headersTimeoutMs: 1000, bodyTimeoutMs: 1000 },
        scrape: { intervalMs: 250, staleAfterFailures: 3 },
        now: () => NOW,
      },
    );
    const deps: ObservationDeps = {
      pool: 'p',
      metrics,
      policy,
      prefillRate: new PrefillRate(),
      log: {
        info: (_o: object, m: string) => void lines.push(`info: ${m}`),
        warn: (_o: object, m: string) => void lines.push(`warn: ${m}`),
        error: (_o: object, m: string) => void lines.push(`error: ${m}`),
      },
      capChanged: () => {},
      changed: () => {},
      onEngineBy: (e) => e.inflight,
    };
    const frozenMetric = async () =>
      (await metrics.engineGaugesFrozen.get()).values.find((v) => v.labels['engine'] === 'e')
        ?.value;
    return {
      engine,
      lines,
      frozenMetric,
      scrape: (state: ObservedEngine) => observeEngine(deps, engine, state),
    };
  }

  it('keeps the start of a run of identical scrapes, and starts again at any change', () => {
    const { engine, scrape } = observing();
    scrape(reading(NOW));
    expect(engine.gauges?.unchangedSince).toBe(NOW);
    expect(engine.gauges?.steps).toBe(120);
    scrape(reading(NOW + 250));
    scrape(reading(NOW + 500));
    expect(engine.gauges).toMatchObject({ at: NOW + 500, unchangedSince: NOW });
    // Each of the four numbers breaks the run on its own.
    scrape(reading(NOW + 750, { steps: 121 }));
    expect(engine.gauges?.unchangedSince).toBe(NOW + 750);
    scrape(reading(NOW + 1000, { steps: 121, kv: 0.31 }));
    expect(engine.gauges?.unchangedSince).toBe(NOW + 1000);
    scrape(reading(NOW + 1250, { steps: 121, kv: 0.31, waiting: 1 }));
    expect(engine.gauges?.unchangedSince).toBe(NOW + 1250);
    scrape(reading(NOW + 1500, { steps: 121, kv: 0.31, waiting: 1, running: 3 }));
    expect(engine.gauges?.unchangedSince).toBe(NOW + 1500);
    // An engine that stops exporting the counter reads differently too.
    scrape(reading(NOW + 1750, { steps: undefined, kv: 0.31, waiting: 1, running: 3 }));
    expect(engine.gauges?.unchangedSince).toBe(NOW + 1750);
  });

  it('a repeated state of the same scrape (a failure after it) does not move anything', () => {
    const { engine, scrape } = observing();
    const first = reading(NOW);
    scrape(first);
    scrape(reading(NOW + 250));
    scrape({ ...reading(NOW + 250), consecutiveFailures: 1, lastError: 'HTTP 500' });
    expect(engine.gauges).toMatchObject({ at: NOW + 250, unchangedSince: NOW });
  });

  it('finds them frozen once the run spans the threshold with nothing of ours in flight: warned once, gauge 1, one probe', async () => {
    const { engine, lines, frozenMetric, scrape } = observing();
    // The engine still shows the four streams Sluice's clients just abandoned.
    for (let t = 0; t < 1000; t += 250) scrape(reading(NOW + t));
    expect(lines).toEqual([]);
    expect(gateDecision(engine, frozenGate, NOW + 750)).toEqual({
      admit: false,
      reason: 'engine_busy',
    });
    scrape(reading(NOW + 1000));
    expect(lines).toEqual([expect.stringMatching(/^warn: engine gauges frozen/)]);
    expect(await frozenMetric()).toBe(1);
    expect(gateDecision(engine, frozenGate, NOW + 1000)).toEqual({ admit: true });
    // The probe is in flight: nothing else goes, and the episode is not said again.
    engine.inflight = 1;
    expect(gateDecision(engine, frozenGate, NOW + 1000)).toEqual({
      admit: false,
      reason: 'engine_busy',
    });
    scrape(reading(NOW + 1250));
    scrape(reading(NOW + 1500));
    expect(lines).toHaveLength(1);
    expect(await frozenMetric()).toBe(1);
    // The probe made the engine step: the gauges say what is there, and normal gating resumes.
    scrape(reading(NOW + 1750, { running: 1, steps: 125 }));
    expect(await frozenMetric()).toBe(0);
    expect(lines).toEqual([
      expect.stringMatching(/^warn: engine gauges frozen/),
      'info: engine gauges moved again: normal gating',
    ]);
    expect(gateDecision(engine, frozenGate, NOW + 1750)).toEqual({ admit: true });
  });

  it('is not frozen while Sluice has something in flight there, nor with the threshold at 0', async () => {
    const busy = observing();
    busy.engine.inflight = 1;
    for (let t = 0; t <= 3000; t += 250) busy.scrape(reading(NOW + t));
    expect(busy.lines).toEqual([]);
    expect(await busy.frozenMetric()).toBeUndefined();

    const never = observing({ ...gate, frozenAfterMs: 0 });
    for (let t = 0; t <= 3000; t += 250) never.scrape(reading(NOW + t));
    expect(never.lines).toEqual([]);
    expect(gateDecision(never.engine, { ...gate, frozenAfterMs: 0 }, NOW + 3000).admit).toBe(false);
  });

  it('an engine whose step counter moves is never frozen, however long its gauges stand still', () => {
    const { engine, lines, scrape } = observing();
    for (let t = 0; t <= 5000; t += 250) scrape(reading(NOW + t, { steps: 120 + t }));
    expect(engine.gauges?.unchangedSince).toBe(NOW + 5000);
    expect(lines).toEqual([]);
    expect(gateDecision(engine, frozenGate, NOW + 5000)).toEqual({
      admit: false,
      reason: 'engine_busy',
    });
  });

  it('gauges that leave the gate open are not frozen, however still', () => {
    const { engine, lines, scrape } = observing();
    for (let t = 0; t <= 3000; t += 250) scrape(reading(NOW + t, { running: 0 }));
    expect(lines).toEqual([]);
    expect(gateDecision(engine, frozenGate, NOW + 3000)).toEqual({ admit: true });
  });
});
