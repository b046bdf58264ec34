// /metrics of the simulated engine, with vLLM's own metric names, help texts and labels.
import type { Engine } from './engine.js';
import { ExpositionWriter, goFloat, labelText } from './exposition.js';

export interface MetricsRenderer {
  render(): string;
}

export function createMetricsRenderer(engine: Engine): MetricsRenderer {
  const { options, scheduler, stats } = engine;
  // vLLM V1 declares labelnames = ["model_name", "engine"]; labels and their text are
  // fixed for the life of the process, so they are rendered once.
  const labels = labelText([
    ['model_name', options.model],
    ['engine', '0'],
  ]);
  const cacheConfig = labelText([
    ['block_size', String(options.blockSize)],
    ['gpu_memory_utilization', '0.9'],
    ['swap_space', '4'],
    ['cache_dtype', 'auto'],
    ['is_attention_free', 'False'],
    ['num_gpu_blocks_override', 'None'],
    ['sliding_window', 'None'],
    ['enable_prefix_caching', options.enablePrefixCaching ? 'True' : 'False'],
    ['cpu_offload_gb', '0'],
    ['calculate_kv_scales', 'False'],
    ['num_gpu_blocks', String(options.numGpuBlocks)],
    ['num_cpu_blocks', 'None'],
    ['engine', '0'],
  ]);
  const finishedLabel = (reason: string) =>
    labelText([
      ['model_name', options.model],
      ['engine', '0'],
      ['finished_reason', reason],
    ]);
  const finishedLabels = {
    stop: finishedLabel('stop'),
    length: finishedLabel('length'),
    abort: finishedLabel('abort'),
  };
  const created = goFloat(engine.clock.startedAtEpoch);
  const kvName = options.legacyKvMetric ? 'vllm:gpu_cache_usage_perc' : 'vllm:kv_cache_usage_perc';
  const kvHelp = options.legacyKvMetric
    ? 'GPU KV-cache usage. 1 means 100 percent usage.'
    : 'KV-cache usage. 1 means 100 percent usage.';

  return {
    render() {
      const w = new ExpositionWriter(created);
      // Live, or as of the last step's end with --metrics-per-step (Engine.publishedGauges).
      const gauges = engine.publishedGauges();
      w.gauge(
        'vllm:num_requests_running',
        'Number of requests in model execution batches.',
        labels,
        gauges.running,
      );
      w.gauge(
        'vllm:num_requests_waiting',
        'Number of requests waiting to be processed.',
        labels,
        gauges.waiting,
      );
      w.gauge(kvName, kvHelp, labels, gauges.kvUsage);
      // loggers.py: "vllm:prefix_cache_queries" ("Prefix cache queries, in terms of number of
      // queried tokens.") and "vllm:prefix_cache_hits", counters.
      w.counter(
        'vllm:prefix_cache_queries',
        'Prefix cache queries, in terms of number of queried tokens.',
        [[labels, scheduler.prefixCacheQueries]],
      );
      w.counter(
        'vllm:prefix_cache_hits',
        'Prefix cache hits, in terms of number of cached tokens.',
        [[labels, scheduler.prefixCacheHits]],
      );
      w.counter('vllm:num_preemptions', 'Cumulative number of preemption from the engine.', [
        [labels, scheduler.preemptions],
      ]);
      w.counter('vllm:prompt_tokens', 'Number of prefill tokens processed.', [
        [labels, stats.promptTokens],
      ]);
      w.counter('vllm:generation_tokens', 'Number of generation tokens processed.', [
        [labels, stats.generationTokens],
      ]);
      w.counter('vllm:request_success', 'Count of successfully processed requests.', [
        [finishedLabels.stop, stats.finished.stop],
        [finishedLabels.length, stats.finished.length],
        [finishedLabels.abort, stats.finished.abort],
      ]);
      w.histogram(
        'vllm:iteration_tokens_total',
        'Histogram of number of tokens per engine_step.',
        labels,
        stats.iterationTokens,
      );
      w.histogram(
        'vllm:time_to_first_token_seconds',
        'Histogram of time to first token in seconds.',
        labels,
        stats.ttft,
      );
      w.histogram(
        'vllm:inter_token_latency_seconds',
        'Histogram of inter-token latency in seconds.',
        labels,
        stats.interTokenLatency,
      );
      w.histogram(
        'vllm:e2e_request_latency_seconds',
        'Histogram of e2e request latency in seconds.',
        labels,
        stats.e2eLatency,
      );
      w.histogram(
        'vllm:request_queue_time_seconds',
        'Histogram of time spent in WAITING phase for request.',
        labels,
        stats.queueTime,
      );
      w.histogram(
        'vllm:request_inference_time_seconds',
        'Histogram of time spent in RUNNING phase for request.',
        labels,
        stats.inferenceTime,
      );
      w.histogram(
        'vllm:request_prefill_time_seconds',
        'Histogram of time spent in PREFILL phase for request.',
        labels,
        stats.prefillTime,
      );
      w.histogram(
        'vllm:request_prompt_tokens',
        'Number of prefill tokens processed.',
        labels,
        stats.requestPromptTokens,
      );
      w.histogram(
        'vllm:request_prefill_kv_computed_tokens',
        'Histogram of new KV tokens computed during prefill (excluding cached tokens).',
        labels,
        stats.requestPrefillKvComputedTokens,
      );
      w.histogram(
        'vllm:request_decode_time_seconds',
        'Histogram of time spent in DECODE phase for request.',
        labels,
        stats.decodeTime,
      );
      w.gauge('vllm:cache_config_info', 'Information of the LLMEngine CacheConfig', cacheConfig, 1);
      // Not a vLLM series: the simulator's own record, so tests can prove a cap held.
      w.gauge(
        'sim_peak_requests',
        'Highest running + waiting the simulated engine ever held.',
        labels,
        scheduler.peakRequests,
      );
      return w.text();
    },
  };
}
