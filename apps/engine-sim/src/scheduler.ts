// The core of vLLM V1's scheduler as a plain state machine, with no timers and no I/O:
// `schedule(now)` plans one step, `complete(step)` applies it. engine-loop.ts drives it in
// (scaled) real time; tests drive it step by step.
//
// What is modelled, after vllm/v1/core/sched/scheduler.py:
// - continuous batching up to `maxNumSeqs` running sequences;
// - a per-step token budget; running sequences are scheduled first (a decode needs one
//   token, a prefill in progress takes what is left), then waiting ones in FCFS order,
//   each with a chunk of its prompt (chunked prefill);
// - KV blocks allocated as a sequence grows; when a running sequence cannot get a block,
//   the newest running sequence is preempted (recompute: its blocks are freed and its
//   tokens are computed again when it is rescheduled);
// - no new sequence is admitted in a step that preempted one.

export interface SequenceListener {
  /** One output token was sampled at simulated time `at`. */
  onToken(seq: Sequence, at: number): void;
  /** The sequence finished at `at` (not called for aborts). */
  onFinish(seq: Sequence, at: number): void;
}

export type FinishReason = 'stop' | 'length';
export type SequenceState = 'waiting' | 'running' | 'finished' | 'aborted';

export class Sequence {
  state: SequenceState = 'waiting';
  /** Tokens whose KV is computed (prompt and output). */
  computed = 0;
  /** Output tokens sampled so far. */
  generated = 0;
  /** KV blocks held. */
  blocks = 0;
  preemptions = 0;
  scheduledAt: number | undefined;
  firstTokenAt: number | undefined;
  finishedAt: number | undefined;

  constructor(
    readonly id: string,
    readonly promptTokens: number,
    /** Output tokens this sequence will produce before it finishes. */
    readonly outputTokens: number,
    readonly finishReason: FinishReason,
    readonly arrival: number,
    readonly listener: SequenceListener,
  ) {}

  /** Tokens the sequence holds in total: the prompt and every sampled token. */
  get length(): number {
    return this.promptTokens + this.generated;
  }
}

export interface SchedulerConfig {
  maxNumSeqs: number;
  maxNumBatchedTokens: number;
  numGpuBlocks: number;
  blockSize: number;
  stepOverheadSeconds: number;
  prefillTokensPerSecond: number;
  decodeSecondsPerSequence: number;
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

export class Scheduler {
  readonly running: Sequence[] = [];
  readonly waiting: Sequence[] = [];
  usedBlocks = 0;
  preemptions = 0;
  /** Highest running + waiting ever held, so tests can prove a cap held. */
  peakRequests = 0;
  peakRunning = 0;

  constructor(readonly config: SchedulerConfig) {}

  get kvUsage(): number {
    return this.usedBlocks / this.config.numGpuBlocks;
  }

  add(seq: Sequence): void {
    this.waiting.push(seq);
    this.peakRequests = Math.max(this.peakRequests, this.running.length + this.waiting.length);
  }

  /** Removes a sequence wherever it is and frees its blocks. False when it was already done. */
  abort(seq: Sequence): boolean {
    const list =
      seq.state === 'running' ? this.running : seq.state === 'waiting' ? this.waiting : undefined;
    if (!list) return false;
    list.splice(list.indexOf(seq), 1);
    this.release(seq);
    seq.state = 'aborted';
    return true;
  }

  /** Simulated time at which the next step can start, or undefined when idle. */
  nextStart(cursor: number): number | undefined {
    if (this.running.length > 0) return cursor;
    const head = this.waiting[0];
    return head === undefined ? undefined : Math.max(cursor, head.arrival);
  }

  schedule(now: number): Step | undefined {
    const { maxNumBatchedTokens, maxNumSeqs } = this.config;
    let budget = maxNumBatchedTokens;
    const work: ScheduledWork[] = [];
    let preempted = false;

    for (let i = 0; i < this.running.length && budget > 0;) {
      const seq = this.running[i]!;
      const tokens = Math.min(seq.length - seq.computed, budget);
      let fits = true;
      while (this.blocksFor(seq.computed + tokens) - seq.blocks > this.freeBlocks) {
        const victim = this.running.pop()!;
        this.preempt(victim);
        preempted = true;
        if (victim === seq) {
          fits = false;
          break;
        }
      }
      if (!fits) break;
      this.allocate(seq, seq.computed + tokens);
      work.push({
        seq,
        tokens,
        decode: seq.generated > 0 && tokens === 1 && seq.computed === seq.length - 1,
      });
      budget -= tokens;
      i += 1;
    }

    while (!preempted && budget > 0 && this.running.length < maxNumSeqs) {
      const seq = this.waiting[0];
      if (seq === undefined || seq.arrival > now) break;
      const tokens = Math.min(seq.length - seq.computed, budget);
      if (this.blocksFor(seq.computed + tokens) - seq.blocks > this.freeBlocks) break;
      this.waiting.shift();
      this.allocate(seq, seq.computed + tokens);
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
    const c = this.config;
    const duration =
      c.stepOverheadSeconds +
      prefillTokens / c.prefillTokensPerSecond +
      decodes * c.decodeSecondsPerSequence;
    return { start: now, duration, work, prefillTokens, decodes };
  }

  /** Applies a step at its end time: advances sequences, samples tokens, finishes. */
  complete(step: Step): void {
    const end = step.start + step.duration;
    for (const { seq, tokens } of step.work) {
      if (seq.state !== 'running') continue; // aborted while the step ran
      seq.computed += tokens;
      if (seq.computed < seq.length) continue; // prefill chunk, no token yet
      seq.generated += 1;
      seq.firstTokenAt ??= end;
      seq.listener.onToken(seq, end);
      if (seq.generated >= seq.outputTokens) {
        this.running.splice(this.running.indexOf(seq), 1);
        this.release(seq);
        seq.state = 'finished';
        seq.finishedAt = end;
        seq.listener.onFinish(seq, end);
      }
    }
  }

  get freeBlocks(): number {
    return this.config.numGpuBlocks - this.usedBlocks;
  }

  private blocksFor(tokens: number): number {
    return Math.ceil(tokens / this.config.blockSize);
  }

  private allocate(seq: Sequence, tokens: number): void {
    const need = this.blocksFor(tokens) - seq.blocks;
    if (need > 0) {
      seq.blocks += need;
      this.usedBlocks += need;
    }
  }

  private release(seq: Sequence): void {
    this.usedBlocks -= seq.blocks;
    seq.blocks = 0;
  }

  private preempt(seq: Sequence): void {
    this.release(seq);
    seq.computed = 0;
    seq.state = 'waiting';
    seq.preemptions += 1;
    this.preemptions += 1;
    this.waiting.unshift(seq);
  }
}
