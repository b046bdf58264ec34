import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import type { VllmMetricsErrorCode, VllmState } from '../src/index.js';
import { parseExposition, readVllmState, VLLM_SERIES, VllmMetricsError } from '../src/index.js';
import { escapeLabelValue, pythonFloat, readFixture } from './helpers.js';

const MODEL = 'meta-llama/Llama-3.1-8B-Instruct';

function read(text: string): VllmState {
  return readVllmState(parseExposition(text));
}

function readError(text: string): VllmMetricsError {
  try {
    read(text);
  } catch (error) {
    if (error instanceof VllmMetricsError) return error;
    throw error;
  }
  throw new Error('expected a VllmMetricsError');
}

function expectError(text: string, code: VllmMetricsErrorCode, message: RegExp): VllmMetricsError {
  const error = readError(text);
  expect(error.code).toBe(code);
  expect(error.name).toBe('VllmMetricsError');
  expect(error).toBeInstanceOf(Error);
  expect(error.message).toMatch(message);
  return error;
}

/** The three gauges of one rank, as prometheus_client writes them. */
function rankLines(
  labels: string,
  running: number,
  waiting: number,
  kv: number,
  kvName = 'vllm:kv_cache_usage_perc',
): string[] {
  return [
    `vllm:num_requests_running{${labels}} ${pythonFloat(running)}`,
    `vllm:num_requests_waiting{${labels}} ${pythonFloat(waiting)}`,
    `${kvName}{${labels}} ${pythonFloat(kv)}`,
  ];
}

function withoutLinesStarting(text: string, prefix: string): string {
  return text
    .split('\n')
    .filter((line) => !line.startsWith(prefix))
    .join('\n');
}

describe('readVllmState on real vLLM expositions', () => {
  it('reads a V1 engine (engine="0", vllm:kv_cache_usage_perc)', () => {
    expect(read(readFixture('vllm-v1-engine.prom'))).toEqual({
      running: 12,
      waiting: 3,
      kvUsage: 0.4375623,
      kvMetric: 'vllm:kv_cache_usage_perc',
      kvCapacityTokens: 9527 * 16,
      kvRankCapacityTokens: 9527 * 16,
      steps: 30_000,
      ranks: 1,
      models: [MODEL],
    });
  });

  it('reads an older engine (no engine label, vllm:gpu_cache_usage_perc)', () => {
    expect(read(readFixture('vllm-v0-engine.prom'))).toEqual({
      running: 7,
      waiting: 1,
      kvUsage: 0.8125,
      kvMetric: 'vllm:gpu_cache_usage_perc',
      kvCapacityTokens: 7455 * 16,
      kvRankCapacityTokens: 7455 * 16,
      ranks: 1,
      models: [MODEL],
    });
  });

  it('combines two data-parallel ranks: counts summed, KV usage the fullest rank, capacity the total every rank shows', () => {
    // vLLM's front end sums the ranks' blocks (9527 + 9461) into one cache_config and shows
    // it under each rank (vllm/v1/engine/utils.py, vllm/v1/metrics/loggers.py).
    expect(read(readFixture('vllm-v1-dp2-engine.prom'))).toEqual({
      running: 12 + 4,
      waiting: 3 + 0,
      kvUsage: 0.9162314,
      kvMetric: 'vllm:kv_cache_usage_perc',
      kvCapacityTokens: 18988 * 16,
      kvRankCapacityTokens: (18988 * 16) / 2,
      steps: 30_000 + 30_000,
      ranks: 2,
      models: [MODEL],
    });
  });

  it('does not depend on the order of the samples', () => {
    const text = readFixture('vllm-v1-dp2-engine.prom');
    const reversed = text
      .split('\n')
      .filter((line) => !line.startsWith('#'))
      .reverse()
      .join('\n');
    expect(read(reversed)).toEqual(read(text));
  });

  it('exports the series names it reads', () => {
    expect(VLLM_SERIES).toEqual({
      running: 'vllm:num_requests_running',
      waiting: 'vllm:num_requests_waiting',
      kvUsage: 'vllm:kv_cache_usage_perc',
      legacyKvUsage: 'vllm:gpu_cache_usage_perc',
      cacheConfigInfo: 'vllm:cache_config_info',
      promptTokensSum: 'vllm:request_prompt_tokens_sum',
      prefillSecondsSum: 'vllm:request_prefill_time_seconds_sum',
      prefillComputedTokensSum: 'vllm:request_prefill_kv_computed_tokens_sum',
      steps: 'vllm:iteration_tokens_total_count',
    });
  });
});

describe('readVllmState: engine steps', () => {
  const gauges = [
    'vllm:num_requests_running{engine="0"} 1',
    'vllm:num_requests_waiting{engine="0"} 0',
    'vllm:kv_cache_usage_perc{engine="0"} 0.5',
  ];
  const steps = (extra: string[]) =>
    readVllmState(parseExposition([...gauges, ...extra, ''].join('\n'))).steps;

  it("reads vllm:iteration_tokens_total's count, summed over ranks", () => {
    expect(steps(['vllm:iteration_tokens_total_count{engine="0"} 41.0'])).toBe(41);
    expect(
      steps([
        'vllm:num_requests_running{engine="1"} 0',
        'vllm:iteration_tokens_total_count{engine="0"} 41.0',
        'vllm:iteration_tokens_total_count{engine="1"} 9.0',
      ]),
    ).toBe(50);
  });

  it('leaves it out when the series is missing or a value is not a count, and still reads the gauges', () => {
    expect(steps([])).toBeUndefined();
    expect(steps(['vllm:iteration_tokens_total_count{engine="0"} NaN'])).toBeUndefined();
    expect(
      steps([
        'vllm:iteration_tokens_total_count{engine="0"} -1',
        'vllm:iteration_tokens_total_count{engine="1"} 4',
      ]),
    ).toBeUndefined();
    expect(steps(['vllm:iteration_tokens_total_count{engine="0"} +Inf'])).toBeUndefined();
  });

  it('does not take the sum or a bucket for the count', () => {
    expect(
      steps([
        'vllm:iteration_tokens_total_sum{engine="0"} 900.0',
        'vllm:iteration_tokens_total_bucket{engine="0",le="+Inf"} 7.0',
      ]),
    ).toBeUndefined();
  });
});

describe('readVllmState: prefill totals', () => {
  const base = (extra: string[]) =>
    readVllmState(
      parseExposition(
        [
          'vllm:num_requests_running{engine="0"} 1',
          'vllm:num_requests_waiting{engine="0"} 0',
          'vllm:kv_cache_usage_perc{engine="0"} 0.5',
          ...extra,
          '',
        ].join('\n'),
      ),
    );

  it("sums an older engine's prompt tokens and prefill seconds over ranks, cache hits included", () => {
    const state = base([
      'vllm:request_prompt_tokens_sum{engine="0"} 70000',
      'vllm:request_prompt_tokens_sum{engine="1"} 1000',
      'vllm:request_prefill_time_seconds_sum{engine="0"} 250',
      'vllm:request_prefill_time_seconds_sum{engine="1"} 2',
    ]);
    expect(state.prefillTotals).toEqual({ tokens: 71_000, seconds: 252, excludesCached: false });
  });

  it('reads the computed tokens, not the prompt tokens, where vLLM >= 0.13 exports them', () => {
    // One rank of a vLLM 0.13 server, as prometheus_client writes it (buckets trimmed): a
    // cold 65,536-token prompt (250 s of prefill) and four turns of a 64,000-token
    // conversation, each with 63,488 tokens in the prefix cache (512 computed, 0.1 s). Prompt
    // tokens over prefill seconds read 1,284 tokens a second; the engine computed 270.
    const labels = 'engine="0",model_name="Qwen/Qwen3-32B"';
    const state = read(
      [
        ...rankLines(labels, 1, 0, 0.31),
        '# HELP vllm:request_prompt_tokens Number of prefill tokens processed.',
        '# TYPE vllm:request_prompt_tokens histogram',
        `vllm:request_prompt_tokens_bucket{engine="0",le="50000.0",model_name="Qwen/Qwen3-32B"} 0.0`,
        `vllm:request_prompt_tokens_bucket{engine="0",le="100000.0",model_name="Qwen/Qwen3-32B"} 5.0`,
        `vllm:request_prompt_tokens_bucket{engine="0",le="+Inf",model_name="Qwen/Qwen3-32B"} 5.0`,
        `vllm:request_prompt_tokens_count{${labels}} 5.0`,
        `vllm:request_prompt_tokens_sum{${labels}} 321536.0`,
        '# HELP vllm:request_prefill_time_seconds Histogram of time spent in PREFILL phase for request.',
        '# TYPE vllm:request_prefill_time_seconds histogram',
        `vllm:request_prefill_time_seconds_bucket{engine="0",le="0.3",model_name="Qwen/Qwen3-32B"} 4.0`,
        `vllm:request_prefill_time_seconds_bucket{engine="0",le="480.0",model_name="Qwen/Qwen3-32B"} 5.0`,
        `vllm:request_prefill_time_seconds_bucket{engine="0",le="+Inf",model_name="Qwen/Qwen3-32B"} 5.0`,
        `vllm:request_prefill_time_seconds_count{${labels}} 5.0`,
        `vllm:request_prefill_time_seconds_sum{${labels}} 250.4`,
        '# HELP vllm:request_prefill_kv_computed_tokens Histogram of new KV tokens computed during prefill (excluding cached tokens).',
        '# TYPE vllm:request_prefill_kv_computed_tokens histogram',
        `vllm:request_prefill_kv_computed_tokens_bucket{engine="0",le="1000.0",model_name="Qwen/Qwen3-32B"} 4.0`,
        `vllm:request_prefill_kv_computed_tokens_bucket{engine="0",le="100000.0",model_name="Qwen/Qwen3-32B"} 5.0`,
        `vllm:request_prefill_kv_computed_tokens_bucket{engine="0",le="+Inf",model_name="Qwen/Qwen3-32B"} 5.0`,
        `vllm:request_prefill_kv_computed_tokens_count{${labels}} 5.0`,
        `vllm:request_prefill_kv_computed_tokens_sum{${labels}} 67584.0`,
        '# HELP vllm:request_prefill_kv_computed_tokens_created Histogram of new KV tokens computed during prefill (excluding cached tokens).',
        '# TYPE vllm:request_prefill_kv_computed_tokens_created gauge',
        `vllm:request_prefill_kv_computed_tokens_created{${labels}} 1.7659e+09`,
        '',
      ].join('\n'),
    );
    expect(state.prefillTotals).toEqual({ tokens: 67_584, seconds: 250.4, excludesCached: true });
  });

  it('sums the computed tokens over ranks', () => {
    const state = base([
      'vllm:request_prompt_tokens_sum{engine="0"} 70000',
      'vllm:request_prompt_tokens_sum{engine="1"} 64000',
      'vllm:request_prefill_kv_computed_tokens_sum{engine="0"} 65536',
      'vllm:request_prefill_kv_computed_tokens_sum{engine="1"} 512',
      'vllm:request_prefill_time_seconds_sum{engine="0"} 250',
      'vllm:request_prefill_time_seconds_sum{engine="1"} 0.1',
    ]);
    expect(state.prefillTotals).toEqual({ tokens: 66_048, seconds: 250.1, excludesCached: true });
  });

  it('leaves them out when one is missing or unreadable, without failing the scrape', () => {
    expect(
      base(['vllm:request_prompt_tokens_sum{engine="0"} 70000']).prefillTotals,
    ).toBeUndefined();
    expect(
      base([
        'vllm:request_prompt_tokens_sum{engine="0"} NaN',
        'vllm:request_prefill_time_seconds_sum{engine="0"} 2',
      ]).prefillTotals,
    ).toBeUndefined();
    // An unreadable computed sum is not replaced by the prompt tokens: the next scrape's
    // difference would mix the two.
    expect(
      base([
        'vllm:request_prompt_tokens_sum{engine="0"} 70000',
        'vllm:request_prefill_kv_computed_tokens_sum{engine="0"} -1',
        'vllm:request_prefill_time_seconds_sum{engine="0"} 2',
      ]).prefillTotals,
    ).toBeUndefined();
    expect(base([]).running).toBe(1);
  });
});

describe('readVllmState: KV-cache names', () => {
  it('prefers vllm:kv_cache_usage_perc when both names are exported', () => {
    const text = [
      ...rankLines('engine="0"', 1, 0, 0.25),
      'vllm:gpu_cache_usage_perc{engine="0"} 0.75',
    ].join('\n');
    expect(read(text)).toMatchObject({
      kvUsage: 0.25,
      kvMetric: 'vllm:kv_cache_usage_perc',
    });
  });

  it('accepts 0 and 1 exactly', () => {
    expect(read(rankLines('', 0, 0, 0).join('\n')).kvUsage).toBe(0);
    expect(read(rankLines('', 0, 0, 1).join('\n')).kvUsage).toBe(1);
  });
});

describe('readVllmState: ranks and models', () => {
  it('counts samples without an engine label as one rank', () => {
    const state = read(rankLines('model_name="m"', 2, 1, 0.5).join('\n'));
    expect(state).toMatchObject({ ranks: 1, running: 2, waiting: 1, models: ['m'] });
  });

  it('sums four ranks and takes the fullest one, even when it is not the busiest', () => {
    const text = [
      ...rankLines('engine="0",model_name="m"', 10, 5, 0.3),
      ...rankLines('engine="1",model_name="m"', 1, 0, 0.97),
      ...rankLines('engine="2",model_name="m"', 8, 2, 0.5),
      ...rankLines('engine="3",model_name="m"', 0, 0, 0),
    ].join('\n');
    expect(read(text)).toMatchObject({ running: 19, waiting: 7, kvUsage: 0.97, ranks: 4 });
  });

  it('lists every model_name in order of appearance, and sums their series', () => {
    const text = [
      ...rankLines('engine="0",model_name="b"', 1, 2, 0.1),
      ...rankLines('engine="0",model_name="a"', 3, 4, 0.2),
    ].join('\n');
    expect(read(text)).toMatchObject({ running: 4, waiting: 6, models: ['b', 'a'], ranks: 1 });
  });

  it('gives an empty model list when the gauges have no model_name', () => {
    expect(read(rankLines('', 0, 0, 0).join('\n')).models).toEqual([]);
  });
});

describe('readVllmState: KV capacity', () => {
  const info = (labels: string) => `vllm:cache_config_info{${labels}} 1.0`;

  it('is absent without vllm:cache_config_info', () => {
    const text = withoutLinesStarting(
      readFixture('vllm-v1-engine.prom'),
      'vllm:cache_config_info{',
    );
    expect(read(text).kvCapacityTokens).toBeUndefined();
  });

  it('is absent when num_gpu_blocks is None or block_size is missing', () => {
    const base = rankLines('engine="0"', 0, 0, 0);
    const none = [...base, info('block_size="16",engine="0",num_gpu_blocks="None"')];
    expect(read(none.join('\n')).kvCapacityTokens).toBeUndefined();
    const noSize = [...base, info('engine="0",num_gpu_blocks="100"')];
    expect(read(noSize.join('\n')).kvCapacityTokens).toBeUndefined();
    const zero = [...base, info('block_size="16",engine="0",num_gpu_blocks="0"')];
    expect(read(zero.join('\n')).kvCapacityTokens).toBeUndefined();
  });

  it('is absent when one of two ranks has no readable cache_config_info (never a partial sum)', () => {
    const text = readFixture('vllm-v1-dp2-engine.prom').replace(
      /(vllm:cache_config_info\{.*engine="1".*)num_gpu_blocks="18988"/,
      '$1num_gpu_blocks="None"',
    );
    expect(text).toContain('num_gpu_blocks="None"');
    expect(read(text).kvCapacityTokens).toBeUndefined();
  });

  it('takes an unlabelled cache_config_info for a single engine="0" rank', () => {
    const text = [...rankLines('engine="0"', 0, 0, 0), info('block_size="32",num_gpu_blocks="10"')];
    expect(read(text.join('\n')).kvCapacityTokens).toBe(320);
  });

  it('counts the total every rank shows once, and gives each rank an equal share of it', () => {
    const text = [
      ...rankLines('engine="0"', 0, 0, 0),
      ...rankLines('engine="1"', 0, 0, 0),
      ...rankLines('engine="2"', 0, 0, 0),
      info('block_size="16",engine="0",num_gpu_blocks="100"'),
      info('block_size="16",engine="1",num_gpu_blocks="100"'),
      info('block_size="16",engine="2",num_gpu_blocks="100"'),
    ];
    expect(read(text.join('\n'))).toMatchObject({
      kvCapacityTokens: 100 * 16,
      kvRankCapacityTokens: Math.floor((100 * 16) / 3),
    });
  });

  it('keeps the smallest rank of those the gauges show, not a rank only an info series names', () => {
    const text = [
      ...rankLines('engine="0"', 0, 0, 0),
      ...rankLines('engine="1"', 0, 0, 0),
      info('block_size="16",engine="0",num_gpu_blocks="100"'),
      info('block_size="16",engine="1",num_gpu_blocks="80"'),
      info('block_size="16",engine="7",num_gpu_blocks="5"'),
    ];
    expect(read(text.join('\n'))).toMatchObject({
      kvCapacityTokens: 180 * 16,
      kvRankCapacityTokens: 80 * 16,
    });
    // Without a capacity for every rank there is neither.
    expect(read(text.slice(0, -2).join('\n'))).not.toHaveProperty('kvRankCapacityTokens');
  });

  it('does not spread one unlabelled cache_config_info over several ranks', () => {
    const text = [
      ...rankLines('engine="0"', 0, 0, 0),
      ...rankLines('engine="1"', 0, 0, 0),
      info('block_size="32",num_gpu_blocks="10"'),
    ];
    expect(read(text.join('\n')).kvCapacityTokens).toBeUndefined();
  });
});

describe('readVllmState: max_num_seqs', () => {
  it('is absent from upstream vLLM expositions', () => {
    for (const name of ['vllm-v1-engine.prom', 'vllm-v0-engine.prom', 'vllm-v1-dp2-engine.prom'])
      expect(read(readFixture(name)).maxNumSeqs).toBeUndefined();
  });

  it('reads a max_num_seqs label on vllm:scheduler_config_info', () => {
    const text = [
      ...rankLines('engine="0"', 0, 0, 0),
      'vllm:scheduler_config_info{engine="0",max_num_batched_tokens="8192",max_num_seqs="256"} 1.0',
    ];
    expect(read(text.join('\n')).maxNumSeqs).toBe(256);
  });

  it('reads it on any vllm:*_info series, cache_config_info included', () => {
    const text = readFixture('vllm-v0-engine.prom').replace(
      'vllm:cache_config_info{block_size="16",',
      'vllm:cache_config_info{block_size="16",max_num_seqs="128",',
    );
    expect(read(text)).toMatchObject({ maxNumSeqs: 128, kvCapacityTokens: 7455 * 16 });
  });

  it('ignores the label on series that are not vllm:*_info, and values that are not integers', () => {
    const text = [
      ...rankLines('engine="0"', 0, 0, 0),
      'vllm:num_preemptions_total{engine="0",max_num_seqs="64"} 0.0',
      'other:scheduler_config_info{engine="0",max_num_seqs="64"} 1.0',
    ];
    expect(read(text.join('\n')).maxNumSeqs).toBeUndefined();
    const bad = [...rankLines('', 0, 0, 0), 'vllm:scheduler_config_info{max_num_seqs="auto"} 1.0'];
    expect(read(bad.join('\n')).maxNumSeqs).toBeUndefined();
  });

  it('sums it over ranks, and is absent when a rank lacks it', () => {
    const both = [
      ...rankLines('engine="0"', 0, 0, 0),
      ...rankLines('engine="1"', 0, 0, 0),
      'vllm:scheduler_config_info{engine="0",max_num_seqs="256"} 1.0',
      'vllm:scheduler_config_info{engine="1",max_num_seqs="256"} 1.0',
    ];
    expect(read(both.join('\n')).maxNumSeqs).toBe(512);
    expect(read(both.slice(0, -1).join('\n')).maxNumSeqs).toBeUndefined();
  });

  it('takes the smaller value when two info series disagree for one rank', () => {
    const text = [
      ...rankLines('engine="0"', 0, 0, 0),
      'vllm:scheduler_config_info{engine="0",max_num_seqs="256"} 1.0',
      'vllm:cache_config_info{engine="0",max_num_seqs="128"} 1.0',
    ];
    expect(read(text.join('\n')).maxNumSeqs).toBe(128);
  });
});

describe('readVllmState: not vLLM', () => {
  it('names all three series, and says there is no vllm: series at all', () => {
    const error = expectError(
      '# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 12.5\n',
      'ERR_NOT_VLLM',
      /^metrics do not look like vLLM: missing vllm:num_requests_running, vllm:num_requests_waiting, vllm:kv_cache_usage_perc \(or vllm:gpu_cache_usage_perc\); it has no vllm: series at all/,
    );
    expect(error.series).toEqual([
      'vllm:num_requests_running',
      'vllm:num_requests_waiting',
      'vllm:kv_cache_usage_perc',
    ]);
  });

  it('rejects an empty exposition', () => {
    expectError('', 'ERR_NOT_VLLM', /missing vllm:num_requests_running/);
  });

  it('names only the one series that is missing', () => {
    const text = withoutLinesStarting(
      readFixture('vllm-v1-engine.prom'),
      'vllm:num_requests_waiting{',
    );
    const error = expectError(
      text,
      'ERR_NOT_VLLM',
      /^metrics do not look like vLLM: missing vllm:num_requests_waiting$/,
    );
    expect(error.series).toEqual(['vllm:num_requests_waiting']);
  });

  it('needs one of the KV-cache names', () => {
    const text = withoutLinesStarting(readFixture('vllm-v0-engine.prom'), 'vllm:gpu_cache_usage');
    expectError(
      text,
      'ERR_NOT_VLLM',
      /missing vllm:kv_cache_usage_perc \(or vllm:gpu_cache_usage_perc\)$/,
    );
  });

  it('does not take a HELP/TYPE line without samples as the series', () => {
    const text = [
      '# HELP vllm:num_requests_running Number of requests in model execution batches.',
      '# TYPE vllm:num_requests_running gauge',
      ...rankLines('', 0, 0, 0).slice(1),
    ].join('\n');
    expectError(text, 'ERR_NOT_VLLM', /missing vllm:num_requests_running$/);
  });
});

describe('readVllmState: impossible values', () => {
  it.each([
    [
      'running NaN',
      rankLines('engine="0"', NaN, 0, 0),
      /running\{engine="0"\} is NaN; expected a finite count >= 0/,
    ],
    ['waiting negative', rankLines('', 0, -1, 0), /^vllm:num_requests_waiting is -1; expected/],
    ['running +Inf', rankLines('', Infinity, 0, 0), /is Infinity/],
    [
      'KV above 1',
      rankLines('engine="1"', 0, 0, 1.5),
      /kv_cache_usage_perc\{engine="1"\} is 1\.5; expected a usage in 0\.\.1/,
    ],
    [
      'KV NaN',
      rankLines('', 0, 0, NaN, 'vllm:gpu_cache_usage_perc'),
      /gpu_cache_usage_perc is NaN/,
    ],
    ['KV negative', rankLines('', 0, 0, -0.1), /is -0\.1/],
  ])('%s', (_name, lines, message) => {
    expectError(lines.join('\n'), 'ERR_VLLM_VALUE', message);
  });
});

describe('readVllmState: properties', () => {
  const rank = fc.record({
    running: fc.nat(1024),
    waiting: fc.nat(1024),
    kv: fc.double({ min: 0, max: 1, noNaN: true }),
    blocks: fc.integer({ min: 1, max: 200_000 }),
  });

  it('sums counts, reads capacity as vLLM writes it, and takes the highest KV usage, for any ranks in any order', () => {
    fc.assert(
      fc.property(
        fc.array(rank, { minLength: 1, maxLength: 8 }),
        fc.constantFrom('vllm:kv_cache_usage_perc', 'vllm:gpu_cache_usage_perc'),
        fc.string(),
        fc.func(fc.integer()),
        // As vLLM writes it: every rank shows the same (summed) block count.
        fc.boolean(),
        (drawn, kvName, model, order, shared) => {
          const ranks = shared ? drawn.map((r) => ({ ...r, blocks: drawn[0]!.blocks })) : drawn;
          const counts = ranks.map((r) => r.blocks * 16);
          const same = counts.every((c) => c === counts[0]);
          const lines = ranks.flatMap((r, i) => [
            ...rankLines(
              `engine="${i}",model_name="${escapeLabelValue(model)}"`,
              r.running,
              r.waiting,
              r.kv,
              kvName,
            ),
            `vllm:cache_config_info{block_size="16",engine="${i}",num_gpu_blocks="${r.blocks}"} 1.0`,
          ]);
          const shuffled = lines
            .map((line, i) => [order(i), line] as const)
            .sort((a, b) => a[0] - b[0])
            .map(([, line]) => line);
          expect(read(shuffled.join('\n'))).toEqual({
            running: ranks.reduce((s, r) => s + r.running, 0),
            waiting: ranks.reduce((s, r) => s + r.waiting, 0),
            kvUsage: Math.max(...ranks.map((r) => r.kv)),
            kvMetric: kvName,
            kvCapacityTokens: same ? counts[0] : counts.reduce((a, b) => a + b, 0),
            kvRankCapacityTokens: same
              ? Math.floor(counts[0]! / counts.length)
              : Math.min(...counts),
            ranks: ranks.length,
            models: [model],
          });
        },
      ),
    );
  });
});
