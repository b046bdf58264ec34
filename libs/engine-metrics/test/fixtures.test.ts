import { describe, expect, it } from 'vitest';
import type { Sample } from '../src/index.js';
import { parseExposition, sampleValue } from '../src/index.js';
import { readFixture } from './helpers.js';

const MODEL = 'meta-llama/Llama-3.1-8B-Instruct';

/**
 * A deliberately naive line-by-line reading of a well-formed fixture (regexes,
 * split), to check the fast parser against something written differently.
 */
function naiveSamples(text: string): Sample[] {
  const specials: Record<string, number> = { '+Inf': Infinity, '-Inf': -Infinity, NaN: NaN };
  return text
    .split('\n')
    .filter((line) => line !== '' && !line.startsWith('#'))
    .map((line) => {
      const m = /^([^{ ]+)(?:\{(.*)\})? (\S+)$/.exec(line);
      if (!m) throw new Error(`fixture line not understood: ${line}`);
      const labels: Record<string, string> = {};
      for (const [, k, v] of (m[2] ?? '').matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) {
        labels[k!] = v!.replace(/\\(.)/g, (_, c: string) => (c === 'n' ? '\n' : c));
      }
      return { name: m[1]!, labels, value: specials[m[3]!] ?? Number(m[3]) };
    });
}

function buckets(samples: readonly Sample[], family: string) {
  return samples
    .filter((s) => s.name === `${family}_bucket`)
    .map((s) => [s.labels['le'], s.value] as const);
}

describe('vLLM V1 engine exposition', () => {
  const text = readFixture('vllm-v1-engine.prom');
  const result = parseExposition(text);
  const engine0 = { engine: '0', model_name: MODEL };

  it('agrees with a naive reading line for line', () => {
    expect(result.samples).toEqual(naiveSamples(text));
    expect(result.samples.length).toBe(248);
  });

  it('reads the scheduler and KV-cache gauges per engine', () => {
    expect(sampleValue(result, 'vllm:num_requests_running', engine0)).toBe(12);
    expect(sampleValue(result, 'vllm:num_requests_waiting', engine0)).toBe(3);
    expect(sampleValue(result, 'vllm:kv_cache_usage_perc', engine0)).toBe(0.4375623);
    expect(sampleValue(result, 'vllm:kv_cache_usage_perc', { engine: '1' })).toBeUndefined();
    expect(result.families.get('vllm:kv_cache_usage_perc')).toEqual({
      name: 'vllm:kv_cache_usage_perc',
      type: 'gauge',
      help: 'KV-cache usage. 1 means 100 percent usage.',
    });
  });

  it('labels every vllm: sample with engine "0", and all but cache_config_info with the model', () => {
    const vllm = result.samples.filter((s) => s.name.startsWith('vllm:'));
    expect(vllm.length).toBeGreaterThan(150);
    for (const s of vllm) {
      expect(s.labels['engine']).toBe('0');
      if (s.name !== 'vllm:cache_config_info') expect(s.labels['model_name']).toBe(MODEL);
    }
  });

  it('reads vllm:cache_config_info with num_gpu_blocks as a label', () => {
    const info = result.samples.find((s) => s.name === 'vllm:cache_config_info');
    expect(info?.value).toBe(1);
    expect(info?.labels).toMatchObject({
      block_size: '16',
      cache_dtype: 'auto',
      enable_prefix_caching: 'True',
      engine: '0',
      num_gpu_blocks: '9527',
      num_cpu_blocks: 'None',
      swap_space_bytes: '4294967296',
    });
  });

  it('reads counters written by prometheus_client (family named with _total, 1.2e+06 values)', () => {
    expect(result.families.get('vllm:prompt_tokens_total')?.type).toBe('counter');
    expect(sampleValue(result, 'vllm:prompt_tokens_total', engine0)).toBe(3906411);
    expect(sampleValue(result, 'vllm:request_success_total', { finished_reason: 'length' })).toBe(
      264,
    );
  });

  it('reads histograms: ascending le buckets ending at +Inf that equal _count', () => {
    const family = 'vllm:time_to_first_token_seconds';
    expect(result.families.get(family)?.type).toBe('histogram');
    const series = buckets(result.samples, family);
    expect(series).toHaveLength(23);
    expect(series[0]).toEqual(['0.001', expect.any(Number)]);
    expect(series.at(-1)?.[0]).toBe('+Inf');
    const bounds = series.map(([le]) => Number(le === '+Inf' ? Infinity : le));
    expect([...bounds].sort((a, b) => a - b)).toEqual(bounds);
    const counts = series.map(([, v]) => v);
    expect([...counts].sort((a, b) => a - b)).toEqual(counts);
    expect(series.at(-1)?.[1]).toBe(sampleValue(result, `${family}_count`, engine0));
    expect(sampleValue(result, `${family}_count`)).toBe(2054);
  });

  it('reads _created samples as gauges of their own, with values like 1.79e+09', () => {
    const created = result.samples.filter((s) => s.name.endsWith('_created'));
    expect(created.length).toBeGreaterThan(20);
    for (const s of created) {
      expect(s.value).toBeGreaterThan(1.7e9);
      expect(s.value).toBeLessThan(2e9);
      expect(result.families.get(s.name)?.type).toBe('gauge');
    }
  });

  it('keeps help text exactly, including a double space and a trailing blank', () => {
    expect(result.families.get('vllm:time_per_prefill_token_request_seconds')?.help).toBe(
      'Time spent per token during prefill  phase in seconds',
    );
    expect(result.families.get('http_request_duration_seconds')?.help).toMatch(/important\. $/);
    expect(result.families.get('http_request_size_bytes')?.type).toBe('summary');
  });

  it('parses the same with \\r\\n line endings and without the final newline', () => {
    expect(parseExposition(text.replace(/\n/g, '\r\n'))).toEqual(result);
    expect(parseExposition(text.trimEnd())).toEqual(result);
  });
});

describe('older vLLM (V0) engine exposition', () => {
  const text = readFixture('vllm-v0-engine.prom');
  const result = parseExposition(text);
  const model = { model_name: MODEL };

  it('agrees with a naive reading line for line', () => {
    expect(result.samples).toEqual(naiveSamples(text));
  });

  it('has no engine label and reports vllm:gpu_cache_usage_perc', () => {
    const vllm = result.samples.filter((s) => s.name.startsWith('vllm:'));
    expect(vllm.length).toBeGreaterThan(40);
    expect(vllm.some((s) => 'engine' in s.labels)).toBe(false);
    expect(sampleValue(result, 'vllm:gpu_cache_usage_perc', model)).toBe(0.8125);
    expect(sampleValue(result, 'vllm:kv_cache_usage_perc')).toBeUndefined();
    expect(sampleValue(result, 'vllm:num_requests_running', model)).toBe(7);
    expect(sampleValue(result, 'vllm:num_requests_waiting', model)).toBe(1);
    expect(sampleValue(result, 'vllm:num_requests_swapped', model)).toBe(0);
  });

  it('reads negative gauges, 1.8e+07 counters and cache_config_info', () => {
    expect(sampleValue(result, 'vllm:gpu_prefix_cache_hit_rate')).toBe(-1);
    expect(sampleValue(result, 'vllm:prompt_tokens_total')).toBe(18233911);
    const info = result.samples.find((s) => s.name === 'vllm:cache_config_info');
    expect(info?.labels['num_gpu_blocks']).toBe('7455');
    expect(info?.labels['enable_prefix_caching']).toBe('False');
  });

  it('has no _created samples (exported with created series disabled)', () => {
    expect(result.samples.filter((s) => s.name.endsWith('_created'))).toEqual([]);
    expect(buckets(result.samples, 'vllm:e2e_request_latency_seconds').at(-1)).toEqual([
      '+Inf',
      9508,
    ]);
  });
});
