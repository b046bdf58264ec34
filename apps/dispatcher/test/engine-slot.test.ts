// An engine's scrape as the dispatcher takes it in: what the prefill rules then read from the
// slot. Worked on a two-rank data-parallel vLLM server, whose ranks the API server fills by
// queue length, not by free KV.
import { releaseDecision, type GatePolicy, type LongPromptPolicy } from '@sluice/admission';
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

function observedSlot(state: ObservedEngine) {
  const engine = createEngineSlot(
    { name: 'e', url: 'http://127.0.0.1:9', maxInflight: 8, lane: 'any' },
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
    maxInflightSource: 'config',
    prefillRate: new PrefillRate(),
    log: { warn: () => {}, error: () => {} },
    capChanged: () => {},
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
