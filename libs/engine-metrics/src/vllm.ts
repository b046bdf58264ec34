import type { Exposition, Labels, Sample } from './types.js';

/** The vLLM series `readVllmState` reads. */
export const VLLM_SERIES = {
  running: 'vllm:num_requests_running',
  waiting: 'vllm:num_requests_waiting',
  /** KV-cache usage as vLLM >= 0.10 names it. */
  kvUsage: 'vllm:kv_cache_usage_perc',
  /** KV-cache usage as vLLM < 0.10 named it. */
  legacyKvUsage: 'vllm:gpu_cache_usage_perc',
  cacheConfigInfo: 'vllm:cache_config_info',
  /**
   * Histogram sums observed when a request finishes, in one loop over the finished requests
   * (`PrometheusStatLogger.record`, vllm/v1/metrics/loggers.py). `prefill_time` is
   * `first_token_ts - scheduled_ts` (vllm/v1/metrics/stats.py), the time the engine spent on
   * the prompt tokens it computed; `vllm:request_prompt_tokens` counts every prompt token,
   * prefix-cache hits included.
   */
  promptTokensSum: 'vllm:request_prompt_tokens_sum',
  prefillSecondsSum: 'vllm:request_prefill_time_seconds_sum',
  /**
   * The histogram vllm:request_prefill_kv_computed_tokens, "Histogram of new KV tokens
   * computed during prefill (excluding cached tokens)": each finished request's
   * `num_prompt_tokens - max(num_cached_tokens, 0)`, observed in the same loop as the two
   * above (vllm/v1/metrics/loggers.py). Added by vllm-project/vllm#30189, first released in
   * vLLM v0.13.0; older servers do not export it.
   */
  prefillComputedTokensSum: 'vllm:request_prefill_kv_computed_tokens_sum',
  /**
   * The count of the histogram vllm:iteration_tokens_total ("Histogram of number of tokens per
   * engine_step"): one observation per batch of engine-core outputs that carried a request's
   * output (`PrometheusStatLogger.record`, vllm/v1/metrics/loggers.py; the front end makes
   * `IterationStats` only "if (log_stats and num_outputs)", vllm/v1/engine/async_llm.py). So it
   * moves on every step that sampled a token or finished a request, and not on a step that only
   * advanced chunked prefills (the engine core returns no partial-prefill outputs,
   * vllm/v1/core/sched/scheduler.py `update_from_output`); such a step still refreshes the
   * gauges, and the KV usage grows with each chunk's blocks.
   */
  steps: 'vllm:iteration_tokens_total_count',
} as const;

const RUNNING = VLLM_SERIES.running;
const WAITING = VLLM_SERIES.waiting;
const KV_USAGE = VLLM_SERIES.kvUsage;
const LEGACY_KV_USAGE = VLLM_SERIES.legacyKvUsage;
const CACHE_CONFIG_INFO = VLLM_SERIES.cacheConfigInfo;

export type KvMetricName = typeof KV_USAGE | typeof LEGACY_KV_USAGE;

/** What one scrape of a vLLM server's `/metrics` says, combined over its data-parallel ranks. */
export interface VllmState {
  /** `vllm:num_requests_running`, summed over ranks. */
  running: number;
  /** `vllm:num_requests_waiting`, summed over ranks. */
  waiting: number;
  /** KV-cache usage, 0..1: the fullest rank's (the maximum over ranks). */
  kvUsage: number;
  /** The series `kvUsage` came from. */
  kvMetric: KvMetricName;
  /**
   * KV-cache size in tokens: `num_gpu_blocks` x `block_size` from `vllm:cache_config_info`.
   * With data-parallel ranks that all show the same count (vLLM shows every rank the sum of
   * all ranks' blocks), that count once; ranks showing different counts are summed. Absent
   * unless every rank has a readable one.
   */
  kvCapacityTokens?: number;
  /**
   * The smallest rank's KV-cache size in tokens: what one request can count on, since it runs
   * on one rank and the API server picks that rank by queue lengths, never by free KV
   * (`DPLBAsyncMPClient.get_core_engine_for_request`, vllm/v1/engine/core_client.py): an
   * equal share of the total when every rank shows the same count, else the smallest count.
   * Equals `kvCapacityTokens` with one rank; absent when it is.
   */
  kvRankCapacityTokens?: number;
  /**
   * Sequences the server runs at once: a `max_num_seqs` label on a `vllm:*_info` series,
   * summed over ranks. Absent unless every rank has one (upstream vLLM exports none).
   */
  maxNumSeqs?: number;
  /**
   * Prefilled tokens and prefill seconds of the requests finished so far, summed over ranks:
   * between two scrapes of the same kind (`excludesCached` equal), their differences give the
   * engine's prefill rate. The tokens are the sum of `vllm:request_prefill_kv_computed_tokens`
   * where the server exports it (vLLM >= 0.13), else of `vllm:request_prompt_tokens`, which
   * counts prefix-cache hits the prefill seconds never spent time on: with prefix caching (on
   * by default) that rate reads fast. Absent unless the tokens and the seconds both exist.
   */
  prefillTotals?: PrefillTotals;
  /**
   * Engine steps that produced output so far, summed over ranks: `vllm:iteration_tokens_total`'s
   * count (see `VLLM_SERIES.steps`). Moves while the engine steps with requests that decode;
   * frozen, with the gauges, while it runs no step at all. Absent when the series is missing or
   * a value is not a finite count.
   */
  steps?: number;
  /** Data-parallel ranks: distinct `engine` label values (1 when there is no `engine` label). */
  ranks: number;
  /** Distinct `model_name` label values of the gauges above, in order of appearance. */
  models: string[];
}

/** See `VllmState.prefillTotals`. */
export interface PrefillTotals {
  /** Prompt tokens the engine computed (cache hits excluded where `excludesCached`). */
  tokens: number;
  /** The sum of `vllm:request_prefill_time_seconds`. */
  seconds: number;
  /** `tokens` is the sum of `vllm:request_prefill_kv_computed_tokens`: prefix-cache hits excluded. */
  excludesCached: boolean;
}

export type VllmMetricsErrorCode = 'ERR_NOT_VLLM' | 'ERR_VLLM_VALUE';

/**
 * Thrown by `readVllmState`. `ERR_NOT_VLLM`: a required series is missing, so the
 * exposition does not look like vLLM's (a wrong URL, another server). `ERR_VLLM_VALUE`:
 * a required gauge has an impossible value (NaN, negative, KV usage above 1).
 */
export class VllmMetricsError extends Error {
  readonly code: VllmMetricsErrorCode;
  /** The series the message is about. */
  readonly series: readonly string[];

  constructor(code: VllmMetricsErrorCode, message: string, series: readonly string[]) {
    super(message);
    this.name = 'VllmMetricsError';
    this.code = code;
    this.series = series;
  }
}

const NO_ENGINE = '';

function rankOf(labels: Labels): string {
  return Object.hasOwn(labels, 'engine') ? labels['engine']! : NO_ENGINE;
}

function describe(sample: Sample): string {
  const labels = Object.entries(sample.labels)
    .map(([k, v]) => `${k}=${JSON.stringify(v)}`)
    .join(',');
  return labels === '' ? sample.name : `${sample.name}{${labels}}`;
}

function badValue(sample: Sample, expected: string): VllmMetricsError {
  return new VllmMetricsError(
    'ERR_VLLM_VALUE',
    `${describe(sample)} is ${sample.value}; expected ${expected}`,
    [sample.name],
  );
}

/** A label holding a positive integer, as vLLM writes config values; else undefined. */
function positiveInt(labels: Labels, name: string): number | undefined {
  if (!Object.hasOwn(labels, name)) return undefined;
  const text = labels[name]!;
  if (!/^[0-9]{1,15}$/.test(text)) return undefined;
  const value = Number(text);
  return value > 0 ? value : undefined;
}

/**
 * Sums a per-rank value over the ranks the gauges showed. Undefined unless every rank
 * has one, so a partial sum never understates the whole. One rank and one value match
 * whatever their `engine` labels say (an unlabelled info series next to `engine="0"`).
 */
/**
 * The KV capacity of the whole engine and of its smallest rank, from each rank's
 * cache_config_info (undefined unless every rank the gauges show has one). vLLM's front end
 * sums the blocks of every data-parallel rank into one cache_config ("Sum values from all
 * engines in DP case", `wait_for_engine_startup`, vllm/v1/engine/utils.py) and logs that one
 * config under each rank's `engine` label (`log_metrics_info`, vllm/v1/metrics/loggers.py), so
 * every rank shows the total: counted once, with a rank holding an equal share of it. Ranks
 * that show different counts are each their own (summed, the smallest kept). Equal counts are
 * always read as the total, so a rank is never overstated.
 */
function capacityOverRanks(
  capacity: ReadonlyMap<string, number>,
  ranks: ReadonlySet<string>,
): { total: number; smallestRank: number } | undefined {
  const total = sumOverRanks(capacity, ranks);
  if (total === undefined) return undefined;
  if (ranks.size <= 1) return { total, smallestRank: total };
  const perRank = [...ranks].map((rank) => capacity.get(rank)!);
  if (perRank.every((value) => value === perRank[0]))
    return { total: perRank[0]!, smallestRank: Math.floor(perRank[0]! / ranks.size) };
  return { total, smallestRank: Math.min(...perRank) };
}

function sumOverRanks(
  perRank: ReadonlyMap<string, number>,
  ranks: ReadonlySet<string>,
): number | undefined {
  if (ranks.size === 1 && perRank.size === 1) return perRank.values().next().value;
  let total = 0;
  for (const rank of ranks) {
    const value = perRank.get(rank);
    if (value === undefined) return undefined;
    total += value;
  }
  return total;
}

/**
 * Reads the scheduler and KV-cache gauges of a vLLM `/metrics` exposition. Pure.
 *
 * Data-parallel ranks (the `engine` label) are combined as one server: request counts
 * are summed, KV usage is the maximum (the fullest rank), KV capacity and
 * `max_num_seqs` are summed, and the smallest rank's KV capacity is kept beside. Throws `VllmMetricsError` when a required series is
 * missing or holds an impossible value.
 */
export function readVllmState(exposition: Exposition): VllmState {
  let running = 0;
  let waiting = 0;
  let sawRunning = false;
  let sawWaiting = false;
  let kv = -1;
  let legacyKv = -1;
  let sawAnyVllm = false;
  const ranks = new Set<string>();
  const models: string[] = [];
  const capacity = new Map<string, number>();
  const maxNumSeqs = new Map<string, number>();
  // Optional: a bad value drops the pair instead of failing the scrape.
  let promptTokensSum: number | undefined;
  let prefillSecondsSum: number | undefined;
  let computedTokensSum: number | undefined;
  let steps: number | undefined;
  const addSum = (current: number | undefined, value: number) =>
    Number.isFinite(value) && value >= 0 ? (current ?? 0) + value : Number.NaN;

  const gauge = (sample: Sample): void => {
    ranks.add(rankOf(sample.labels));
    if (Object.hasOwn(sample.labels, 'model_name')) {
      const model = sample.labels['model_name']!;
      if (!models.includes(model)) models.push(model);
    }
  };
  const count = (sample: Sample): number => {
    if (!Number.isFinite(sample.value) || sample.value < 0)
      throw badValue(sample, 'a finite count >= 0');
    gauge(sample);
    return sample.value;
  };
  const usage = (sample: Sample, current: number): number => {
    if (!(sample.value >= 0 && sample.value <= 1)) throw badValue(sample, 'a usage in 0..1');
    gauge(sample);
    return Math.max(current, sample.value);
  };

  for (const sample of exposition.samples) {
    const name = sample.name;
    if (!name.startsWith('vllm:')) continue;
    sawAnyVllm = true;
    switch (name) {
      case RUNNING:
        running += count(sample);
        sawRunning = true;
        break;
      case WAITING:
        waiting += count(sample);
        sawWaiting = true;
        break;
      case KV_USAGE:
        kv = usage(sample, kv);
        break;
      case LEGACY_KV_USAGE:
        legacyKv = usage(sample, legacyKv);
        break;
      case VLLM_SERIES.promptTokensSum:
        promptTokensSum = addSum(promptTokensSum, sample.value);
        break;
      case VLLM_SERIES.prefillSecondsSum:
        prefillSecondsSum = addSum(prefillSecondsSum, sample.value);
        break;
      case VLLM_SERIES.prefillComputedTokensSum:
        computedTokensSum = addSum(computedTokensSum, sample.value);
        break;
      case VLLM_SERIES.steps:
        steps = addSum(steps, sample.value);
        break;
    }
    if (name.endsWith('_info')) {
      const rank = rankOf(sample.labels);
      if (name === CACHE_CONFIG_INFO && !capacity.has(rank)) {
        const blocks = positiveInt(sample.labels, 'num_gpu_blocks');
        const blockSize = positiveInt(sample.labels, 'block_size');
        if (blocks !== undefined && blockSize !== undefined) capacity.set(rank, blocks * blockSize);
      }
      const seqs = positiveInt(sample.labels, 'max_num_seqs');
      if (seqs !== undefined) maxNumSeqs.set(rank, Math.min(seqs, maxNumSeqs.get(rank) ?? seqs));
    }
  }

  const missing: string[] = [];
  if (!sawRunning) missing.push(RUNNING);
  if (!sawWaiting) missing.push(WAITING);
  if (kv < 0 && legacyKv < 0) missing.push(`${KV_USAGE} (or ${LEGACY_KV_USAGE})`);
  if (missing.length > 0) {
    const hint = sawAnyVllm ? '' : '; it has no vllm: series at all (is this a vLLM server?)';
    throw new VllmMetricsError(
      'ERR_NOT_VLLM',
      `metrics do not look like vLLM: missing ${missing.join(', ')}${hint}`,
      missing.map((m) => m.split(' ')[0]!),
    );
  }

  const state: VllmState = {
    running,
    waiting,
    kvUsage: kv >= 0 ? kv : legacyKv,
    kvMetric: kv >= 0 ? KV_USAGE : LEGACY_KV_USAGE,
    ranks: ranks.size,
    models,
  };
  const kvCapacity = capacityOverRanks(capacity, ranks);
  if (kvCapacity !== undefined) {
    state.kvCapacityTokens = kvCapacity.total;
    state.kvRankCapacityTokens = kvCapacity.smallestRank;
  }
  const seqs = sumOverRanks(maxNumSeqs, ranks);
  if (seqs !== undefined) state.maxNumSeqs = seqs;
  // A server that exports the computed tokens is read by them only: were an unreadable value
  // to fall back on the prompt tokens, the next difference would mix the two.
  const excludesCached = computedTokensSum !== undefined;
  const tokens = excludesCached ? computedTokensSum : promptTokensSum;
  if (Number.isFinite(tokens) && Number.isFinite(prefillSecondsSum))
    state.prefillTotals = { tokens: tokens!, seconds: prefillSecondsSum!, excludesCached };
  if (steps !== undefined && Number.isFinite(steps)) state.steps = steps;
  return state;
}
