// The core of vLLM V1's scheduler as a plain state machine, with no timers and no I/O:
// `schedule(now)` plans one step, `complete(step)` applies it. engine-loop.ts drives it in
// (scaled) real time; tests drive it step by step.
//
// Every rule follows vllm/v1/core/sched/scheduler.py `Scheduler.schedule` (quoted at each
// place); KV blocks and the prefix cache live in kv-cache.ts, step time in cost-model.ts.
import { stepSeconds, type CostConfig } from './cost-model.js';
import { KvCache } from './kv-cache.js';
import { createRequestQueue, type RequestQueue, type SchedulingPolicy } from './request-queue.js';
import { Sequence } from './sequence.js';

export { Sequence, type FinishReason, type SequenceListener } from './sequence.js';

export interface SchedulerConfig extends Omit<CostConfig, 'prefillContextCost'> {
  maxNumSeqs: number;
  maxNumBatchedTokens: number;
  numGpuBlocks: number;
  blockSize: number;
  /** See cost-model.ts; 0 when absent. */
  prefillContextCost?: number;
  /** `--long-prefill-token-threshold`: most prompt tokens of one request per step; 0 = off. */
  longPrefillTokenThreshold?: number;
  /**
   * `scheduler_reserve_full_isl` (default true): admit a waiting request only when its whole
   * sequence fits in free KV blocks. false: admit when its first chunk fits, as vLLM V1 did
   * before that option existed (PR #37307).
   */
  reserveFullIsl?: boolean;
  /** `--enable-prefix-caching` (vLLM V1 default on); false when absent. */
  enablePrefixCaching?: boolean;
  /** `--scheduling-policy`; fcfs when absent. */
  policy?: SchedulingPolicy;
}

export interface ScheduledWork {
  seq: Sequence;
  tokens: number;
  decode: boolean;
}

export interface Step {
  start: number;
  duration: number;
  work: ScheduledWork[];
  prefillTokens: number;
  decodes: number;
}

export interface StepResult {
  /** Prompt tokens of the sequences that sampled their first token in this step. */
  promptTokens: number;
  /** Output tokens sampled in this step. */
  generationTokens: number;
}

export class Scheduler {
  readonly running: Sequence[] = [];
  readonly kv: KvCache;
  private readonly queue: RequestQueue;
  preemptions = 0;
  /** Prefix cache counters as vLLM exports them (tokens queried / found, new requests only). */
  prefixCacheQueries = 0;
  prefixCacheHits = 0;
  /** Highest running + waiting ever held, so tests can prove a cap held. */
  peakRequests = 0;
  /**
   * Sequences whose abort waits for the step in flight to end (the engine's metricsPerStep):
   * their clients are gone, so they do not count toward `peakRequests` beside a newer arrival.
   */
  abortsPending = 0;
  peakRunning = 0;
  private readonly cost: CostConfig;
  private readonly threshold: number;
  private readonly reserveFullIsl: boolean;
  private readonly policy: SchedulingPolicy;

  constructor(readonly config: SchedulerConfig) {
    this.kv = new KvCache(
      config.numGpuBlocks,
      config.blockSize,
      config.enablePrefixCaching ?? false,
    );
    this.cost = { ...config, prefillContextCost: config.prefillContextCost ?? 0 };
    this.threshold = config.longPrefillTokenThreshold ?? 0;
    this.reserveFullIsl = config.reserveFullIsl ?? true;
    this.policy = config.policy ?? 'fcfs';
    this.queue = createRequestQueue(this.policy);
  }

  /** Waiting sequences in scheduling order (a copy). */
  get waiting(): Sequence[] {
    return [...this.queue];
  }

  get numWaiting(): number {
    return this.queue.length;
  }

  get usedBlocks(): number {
    return this.kv.numUsed;
  }

  get freeBlocks(): number {
    return this.kv.numFree;
  }

  get kvUsage(): number {
    return this.kv.numUsed / this.config.numGpuBlocks;
  }

  add(seq: Sequence): void {
    this.queue.add(seq);
    this.peakRequests = Math.max(
      this.peakRequests,
      this.running.length + this.queue.length - this.abortsPending,
    );
  }

  /** Removes a sequence wherever it is and frees its blocks. False when it was already done. */
  abort(seq: Sequence): boolean {
    if (seq.state === 'running') this.running.splice(this.running.indexOf(seq), 1);
    else if (seq.state !== 'waiting' || !this.queue.remove(seq)) return false;
    this.kv.release(seq);
    seq.state = 'aborted';
    return true;
  }

  /** Simulated time at which the next step can start, or undefined when idle. */
  nextStart(cursor: number): number | undefined {
    if (this.running.length > 0) return cursor;
    const head = this.queue.peek();
    return head === undefined ? undefined : Math.max(cursor, head.arrival);
  }

  schedule(now: number): Step | undefined {
    let budget = this.config.maxNumBatchedTokens;
    const work: ScheduledWork[] = [];
    let preempted = false;

    // "First, schedule the RUNNING requests."
    for (let i = 0; i < this.running.length && budget > 0;) {
      const seq = this.running[i]!;
      const tokens = Math.min(this.capChunk(seq.length - seq.computed), budget);
      if (tokens === 0) {
        i += 1;
        continue;
      }
      // "while True: new_blocks = self.kv_cache_manager.allocate_slots(request,
      // num_new_tokens, ...) ... # Preempt the lowest-priority request."
      let fits = true;
      while (this.kv.blocksToAllocate(seq, seq.computed + tokens, []) > this.kv.numFree) {
        const victim = this.pickVictim();
        if (this.policy === 'priority') {
          // "if preempted_req in scheduled_running_reqs: ... token_budget +=
          // num_scheduled_tokens.pop(preempted_req_id) ... req_index -= 1"
          const k = work.findIndex((w) => w.seq === victim);
          if (k !== -1) {
            budget += work[k]!.tokens;
            work.splice(k, 1);
            i -= 1;
          }
        }
        this.preempt(victim);
        preempted = true;
        if (victim === seq) {
          fits = false;
          break;
        }
      }
      // "if new_blocks is None: # Cannot schedule this request. break"
      if (!fits) break;
      this.kv.grow(seq, seq.computed + tokens);
      this.kv.cacheFullBlocks(seq, seq.computed + tokens);
      work.push({ seq, tokens, decode: seq.generated > 0 && seq.computed === seq.length - 1 });
      budget -= tokens;
      i += 1;
    }

    // "Next, schedule the WAITING requests. if not preempted_reqs ..."
    while (!preempted && budget > 0) {
      // "if len(self.running) == self.max_num_running_reqs: break"
      if (this.running.length >= this.config.maxNumSeqs) break;
      const seq = this.queue.peek();
      if (seq === undefined || seq.arrival > now) break; // not arrived yet (simulated time)
      // "if request.num_computed_tokens == 0: new_computed_blocks, num_new_local_computed_tokens
      // = self.kv_cache_manager.get_computed_blocks(request)"
      const hit = this.kv.findCacheHit(seq, seq.length);
      const computed = hit.length * this.config.blockSize;
      // "num_new_tokens = request.num_tokens - num_computed_tokens; threshold = ...
      // long_prefill_token_threshold; if 0 < threshold < num_new_tokens: num_new_tokens =
      // threshold ... num_new_tokens = min(num_new_tokens, token_budget)"
      const tokens = Math.min(this.capChunk(seq.length - computed), budget);
      // kv_cache_manager.py allocate_slots: "if full_sequence_must_fit: # First check and
      // fail if the full request sequence won't fit. full_num_tokens = min(request.num_tokens,
      // self.max_model_len) ... if required_blocks > self.block_pool.get_num_free_blocks():
      // return None", then the same check for the scheduled chunk.
      if (this.reserveFullIsl && this.kv.blocksToAllocate(seq, seq.length, hit) > this.kv.numFree)
        break;
      if (this.kv.blocksToAllocate(seq, computed + tokens, hit) > this.kv.numFree) break;
      // "if new_blocks is None: # The request cannot be scheduled. ... break": FCFS head-of-line.
      this.queue.pop();
      this.kv.attachHit(seq, hit);
      this.kv.grow(seq, computed + tokens);
      this.kv.cacheFullBlocks(seq, computed + tokens);
      if (seq.preemptions === 0) {
        // PrefixCacheStats.record: preempted requests go to preempted_queries/_hits, which
        // vllm:prefix_cache_queries/hits do not include.
        this.prefixCacheQueries += this.kv.enableCaching ? seq.length : 0;
        this.prefixCacheHits += computed;
      }
      if (seq.cachedTokens < 0) seq.cachedTokens = computed;
      seq.computed = computed;
      seq.state = 'running';
      seq.scheduledAt ??= now;
      this.running.push(seq);
      work.push({ seq, tokens, decode: false });
      budget -= tokens;
    }

    if (work.length === 0) return undefined;
    this.peakRunning = Math.max(this.peakRunning, this.running.length);
    let prefillTokens = 0;
    let decodes = 0;
    for (const w of work) {
      if (w.decode) decodes += 1;
      else prefillTokens += w.tokens;
    }
    const duration = stepSeconds(
      this.cost,
      work.map((w) => ({ start: w.seq.computed, tokens: w.tokens, decode: w.decode })),
    );
    return { start: now, duration, work, prefillTokens, decodes };
  }

  /** Applies a step at its end time: advances sequences, samples tokens, finishes. */
  complete(step: Step): StepResult {
    const end = step.start + step.duration;
    const result: StepResult = { promptTokens: 0, generationTokens: 0 };
    for (const { seq, tokens, decode } of step.work) {
      if (seq.state !== 'running') continue; // aborted while the step ran
      seq.computed += tokens;
      if (!decode) seq.prefilledTokens += tokens;
      if (seq.computed < seq.length) continue; // prefill chunk, no token yet
      seq.generated += 1;
      result.generationTokens += 1;
      if (seq.firstTokenAt === undefined) {
        seq.firstTokenAt = end;
        result.promptTokens += seq.promptTokens;
      }
      seq.listener.onToken(seq, end);
      seq.lastTokenAt = end;
      if (seq.generated >= seq.outputTokens) {
        this.running.splice(this.running.indexOf(seq), 1);
        this.kv.release(seq);
        seq.state = 'finished';
        seq.finishedAt = end;
        seq.listener.onFinish(seq, end);
      }
    }
    return result;
  }

  /** "if 0 < self.scheduler_config.long_prefill_token_threshold < num_new_tokens". */
  private capChunk(tokens: number): number {
    return this.threshold > 0 && this.threshold < tokens ? this.threshold : tokens;
  }

  /**
   * "if self.policy == SchedulingPolicy.PRIORITY: preempted_req = max(self.running,
   * key=lambda r: (r.priority, r.arrival_time)) ... else: preempted_req = self.running.pop()"
   */
  private pickVictim(): Sequence {
    if (this.policy === 'fcfs') return this.running.pop()!;
    let victim = this.running[0]!;
    for (const r of this.running) {
      // Python's max() keeps the first of equal keys.
      if (
        r.priority > victim.priority ||
        (r.priority === victim.priority && r.arrival > victim.arrival)
      )
        victim = r;
    }
    this.running.splice(this.running.indexOf(victim), 1);
    return victim;
  }

  /**
   * `_preempt_request`: "self.kv_cache_manager.free(request) ... request.num_computed_tokens
   * = 0 ... request.num_preemptions += 1 ... self.waiting.prepend_request(request)".
   */
  private preempt(seq: Sequence): void {
    this.kv.release(seq);
    seq.computed = 0;
    seq.state = 'waiting';
    seq.preemptions += 1;
    this.preemptions += 1;
    this.queue.prepend(seq);
  }
}
