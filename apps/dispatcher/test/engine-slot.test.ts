// An engine's scrape as the dispatcher takes it in: what the prefill rules then read from the
// slot. Worked on a two-rank data-parallel vLLM server, whose ranks the API server fills by
// queue length, not by free KV.
import { releaseDecision, type GatePolicy, type LongPromptPolicy } from '@sluice/admission';
import type { EngineConfig } from '@sluice/config';
import { parseExposition, readVllmState, type ObservedEngine } from '@sluice/engine-metrics';
import { dispatcherMetrics, Registry } from '@sluice/observability';
import { describe, expect, it } from 'vitest';
import { createEngineSlot, observeEngine, type ObservationDeps } from '../src/engine-slot.ts';
import { PrefillRate } from '../src/prefill-tracker.ts';

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
  log: ObservationDeps['log'] = { warn: () => {}, error: () => {} },
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
