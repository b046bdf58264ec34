// The simulated engine: scheduler + loop + the counters vLLM exports. One per process.
import { createClock, EngineLoop, type SimClock } from './engine-loop.js';
import { Histogram } from './exposition.js';
import {
  Scheduler,
  Sequence,
  type FinishReason,
  type SequenceListener,
  type StepResult,
} from './scheduler.js';
import type { SimOptions } from './options.js';
import { promptBlockHashes } from './prefix-hash.js';

// Bucket bounds as in vllm/v1/metrics/loggers.py.
export const ttftBuckets = [
  0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
  40.0, 80.0, 160.0, 640.0, 2560.0,
];
export const interTokenLatencyBuckets = [
  0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
  40.0, 80.0,
];
export const iterationTokensBuckets = [
  1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384,
];
export const requestLatencyBuckets = [
  0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
  480.0, 960.0, 1920.0, 7680.0,
];

/**
 * vllm/v1/metrics/loggers.py: "buckets=build_1_2_5_buckets(max_model_len)" for
 * `vllm:request_prompt_tokens` (vllm/v1/metrics/utils.py: 1, 2, 5, 10, 20, 50, ... up to the
 * limit).
 */
export function oneTwoFiveBuckets(max: number): number[] {
  const buckets: number[] = [];
  for (let exponent = 1; ; exponent *= 10)
    for (const mantissa of [1, 2, 5]) {
      const value = mantissa * exponent;
      if (value > max) return buckets;
      buckets.push(value);
    }
}

export interface GenerationRequest {
  id: string;
  promptTokens: number;
  outputTokens: number;
  finishReason: FinishReason;
  onToken(index: number): void;
  onFinish(reason: FinishReason): void;
  /** Prompt content for the prefix cache (see prefix-hash.ts); none: never a cache hit. */
  promptText?: string;
  /** vLLM `cache_salt`: only requests with the same salt share cached blocks (prefix-hash.ts). */
  cacheSalt?: string | undefined;
  /** vLLM `priority` (lower first under --scheduling-policy priority). */
  priority?: number;
}

export interface GenerationHandle {
  readonly sequence: Sequence;
  /** Client gone: drop the sequence and free its KV blocks now. */
  abort(): void;
}

export class EngineStats {
  constructor(maxModelLen = 131_072) {
    this.requestPromptTokens = new Histogram(oneTwoFiveBuckets(maxModelLen));
    this.requestPrefillKvComputedTokens = new Histogram(oneTwoFiveBuckets(maxModelLen));
  }

  promptTokens = 0;
  /** `vllm:request_prompt_tokens`: each finished request's prompt length. */
  readonly requestPromptTokens: Histogram;
  /**
   * `vllm:request_prefill_kv_computed_tokens` (vLLM >= 0.13): each finished request's prompt
   * tokens less those found in the prefix cache.
   */
  readonly requestPrefillKvComputedTokens: Histogram;
  generationTokens = 0;
  readonly finished = { stop: 0, length: 0, abort: 0 };
  readonly ttft = new Histogram(ttftBuckets);
  readonly interTokenLatency = new Histogram(interTokenLatencyBuckets);
  readonly iterationTokens = new Histogram(iterationTokensBuckets);
  readonly queueTime = new Histogram(requestLatencyBuckets);
  readonly prefillTime = new Histogram(requestLatencyBuckets);
  readonly decodeTime = new Histogram(requestLatencyBuckets);
  readonly inferenceTime = new Histogram(requestLatencyBuckets);
  readonly e2eLatency = new Histogram(requestLatencyBuckets);

  /**
   * Per step, as vllm/v1/metrics/loggers.py `record` does per iteration:
   * "self.histogram_iteration_tokens[engine_idx].observe(iteration_stats.num_prompt_tokens +
   * iteration_stats.num_generation_tokens)", where a request's prompt tokens count in the
   * iteration that produced its first token (stats.py `update_from_output`). Only a step that
   * produced output: the front end makes IterationStats "if (log_stats and num_outputs)"
   * (vllm/v1/engine/async_llm.py), and a step that only advanced prefill chunks has none
   * ("Invariant: EngineCore returns no partial prefill outputs", vllm/v1/core/sched/scheduler.py).
   */
  observeStep(promptTokens: number, generationTokens: number): void {
    if (generationTokens === 0) return;
    this.iterationTokens.observe(promptTokens + generationTokens);
  }

  /**
   * One sampled token: TTFT for the first (stats.py "first_token_latency"), otherwise the
   * inter-token latency since the previous token ("inter_token_latencies_iter").
   */
  observeToken(seq: Sequence, at: number): void {
    this.generationTokens += 1;
    if (seq.generated === 1) {
      this.promptTokens += seq.promptTokens;
      this.ttft.observe(at - seq.arrival);
    } else if (seq.lastTokenAt !== undefined) {
      this.interTokenLatency.observe(at - seq.lastTokenAt);
    }
  }

  /**
   * At finish, as loggers.py does "for finished_request in iteration_stats.finished_requests":
   * stats.py `update_from_finished_request`: "queued_time = scheduled_ts - queued_ts",
   * "prefill_time = first_token_ts - scheduled_ts", "decode_time = last_token_ts -
   * first_token_ts", "inference_time = last_token_ts - scheduled_ts"; scheduled_ts is the
   * first scheduling ("if req_stats.scheduled_ts == 0.0: # ignore preemptions").
   */
  observeFinish(seq: Sequence, at: number): void {
    const scheduled = seq.scheduledAt!;
    const first = seq.firstTokenAt!;
    this.e2eLatency.observe(at - seq.arrival);
    // loggers.py: "self.histogram_num_prompt_tokens_request[engine_idx].observe(
    // finished_request.num_prompt_tokens)", in the same loop over finished requests.
    this.requestPromptTokens.observe(seq.promptTokens);
    // loggers.py (vLLM >= 0.13), in the same loop: the prompt's tokens less its cached ones,
    // `num_prompt_tokens - max(num_cached_tokens, 0)`.
    this.requestPrefillKvComputedTokens.observe(seq.promptTokens - Math.max(seq.cachedTokens, 0));
    this.queueTime.observe(scheduled - seq.arrival);
    this.prefillTime.observe(first - scheduled);
    this.inferenceTime.observe(at - scheduled);
    this.decodeTime.observe(at - first);
  }
}

interface Pending {
  request: GenerationRequest;
}

/** The scheduler gauges vLLM exports: `vllm:num_requests_running`, `_waiting`, KV usage. */
export interface SchedulerGauges {
  running: number;
  waiting: number;
  kvUsage: number;
}

export class Engine {
  readonly scheduler: Scheduler;
  readonly loop: EngineLoop;
  readonly clock: SimClock;
  readonly stats: EngineStats;

  // A sequence aborted while a step ran (metricsPerStep) is no longer here: what that step
  // still does for it reaches neither its client nor the stats, as vLLM's front end drops the
  // outputs of a request it has aborted (vllm/v1/engine/output_processor.py).
  private readonly listener: SequenceListener = {
    onToken: (seq, at) => {
      const pending = this.pending.get(seq);
      if (!pending) return;
      this.stats.observeToken(seq, at);
      pending.request.onToken(seq.generated - 1);
    },
    onFinish: (seq, at) => {
      const pending = this.pending.get(seq);
      if (!pending) return;
      this.pending.delete(seq);
      this.stats.finished[seq.finishReason] += 1;
      this.stats.observeFinish(seq, at);
      pending.request.onFinish(seq.finishReason);
    },
  };

  private readonly pending = new Map<Sequence, Pending>();
  /** Aborts that came while a step ran (metricsPerStep): applied once it has ended. */
  private readonly abortsAfterStep: Sequence[] = [];
  /** The gauges as of the end of the last step (metricsPerStep); vLLM starts at 0. */
  private snapshot: SchedulerGauges = { running: 0, waiting: 0, kvUsage: 0 };

  constructor(readonly options: SimOptions) {
    this.stats = new EngineStats(options.maxModelLen);
    this.scheduler = new Scheduler({
      ...options,
      reserveFullIsl: !options.firstChunkAdmission,
      policy: options.schedulingPolicy,
    });
    this.clock = createClock(options.timeScale);
    this.loop = new EngineLoop(this.scheduler, this.clock, options.timeScale, (result) =>
      this.stepEnded(result),
    );
  }

  /**
   * The gauges as /metrics shows them. Live by default. With `metricsPerStep`, as vLLM v1 has
   * them: `PrometheusStatLogger.record` sets them only from the scheduler stats a step returns
   * (vllm/v1/metrics/loggers.py), made at the end of the step (`update_from_output`,
   * vllm/v1/core/sched/scheduler.py), and `EngineCore.step` runs no step while the scheduler
   * has no request (vllm/v1/engine/core.py). So after every request is aborted at once they
   * stay as the last step left them (vllm-project/vllm#22545, #29928). The counters change only
   * within steps here, as there.
   */
  publishedGauges(): SchedulerGauges {
    if (this.options.metricsPerStep) return this.snapshot;
    return this.liveGauges();
  }

  /** Aborts that wait for the step in flight to end (metricsPerStep). */
  get abortsPending(): number {
    return this.abortsAfterStep.length;
  }

  private liveGauges(): SchedulerGauges {
    const { scheduler } = this;
    return {
      running: scheduler.running.length,
      waiting: scheduler.numWaiting,
      kvUsage: scheduler.kvUsage,
    };
  }

  /**
   * The end of a step: its stats, then (metricsPerStep) the snapshot, then the aborts that came
   * meanwhile. vLLM's engine core takes aborts from its input queue between steps, after the
   * step's stats are made (`run_busy_loop`, vllm/v1/engine/core.py), so the last step before a
   * client left still counts its request.
   */
  private stepEnded(result: StepResult): void {
    this.stats.observeStep(result.promptTokens, result.generationTokens);
    if (!this.options.metricsPerStep) return;
    this.snapshot = this.liveGauges();
    for (const seq of this.abortsAfterStep.splice(0)) this.scheduler.abort(seq);
    this.scheduler.abortsPending = 0;
  }

  submit(request: GenerationRequest): GenerationHandle {
    const seq = new Sequence(
      request.id,
      request.promptTokens,
      request.outputTokens,
      request.finishReason,
      this.loop.arrivalTime(),
      this.listener,
      {
        priority: request.priority ?? 0,
        blockHashes:
          this.options.enablePrefixCaching && request.promptText !== undefined
            ? promptBlockHashes(
                request.promptText,
                request.promptTokens,
                this.options.blockSize,
                request.cacheSalt,
              )
            : [],
      },
    );
    this.pending.set(seq, { request });
    this.scheduler.add(seq);
    this.loop.wake();
    return {
      sequence: seq,
      abort: () => {
        if (!this.pending.has(seq)) return; // finished, or aborted already
        if (this.options.metricsPerStep && this.loop.stepInFlight) {
          this.pending.delete(seq);
          this.stats.finished.abort += 1;
          this.abortsAfterStep.push(seq);
          this.scheduler.abortsPending = this.abortsAfterStep.length;
          return;
        }
        if (this.scheduler.abort(seq)) {
          this.pending.delete(seq);
          this.stats.finished.abort += 1;
        }
      },
    };
  }

  close(): void {
    this.loop.close();
  }
}
