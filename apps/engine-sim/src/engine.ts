// The simulated engine: scheduler + loop + the counters vLLM exports. One per process.
import { createClock, EngineLoop, type SimClock } from './engine-loop.js';
import { Histogram } from './exposition.js';
import { Scheduler, Sequence, type FinishReason, type SequenceListener } from './scheduler.js';
import type { SimOptions } from './options.js';

// Bucket bounds as in vllm/v1/metrics/loggers.py.
export const ttftBuckets = [
  0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
  40.0, 80.0, 160.0, 640.0, 2560.0,
];
export const requestLatencyBuckets = [
  0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
  480.0, 960.0, 1920.0, 7680.0,
];

export interface GenerationRequest {
  id: string;
  promptTokens: number;
  outputTokens: number;
  finishReason: FinishReason;
  onToken(index: number): void;
  onFinish(reason: FinishReason): void;
}

export interface GenerationHandle {
  readonly sequence: Sequence;
  /** Client gone: drop the sequence and free its KV blocks now. */
  abort(): void;
}

export class EngineStats {
  promptTokens = 0;
  generationTokens = 0;
  readonly finished = { stop: 0, length: 0, abort: 0 };
  readonly ttft = new Histogram(ttftBuckets);
  readonly queueTime = new Histogram(requestLatencyBuckets);
  readonly prefillTime = new Histogram(requestLatencyBuckets);
  readonly e2eLatency = new Histogram(requestLatencyBuckets);
}

interface Pending {
  request: GenerationRequest;
}

export class Engine {
  readonly scheduler: Scheduler;
  readonly loop: EngineLoop;
  readonly clock: SimClock;
  readonly stats = new EngineStats();

  private readonly listener: SequenceListener = {
    onToken: (seq, at) => {
      const pending = this.pending.get(seq)!;
      this.stats.generationTokens += 1;
      if (seq.generated === 1) {
        this.stats.promptTokens += seq.promptTokens;
        this.stats.ttft.observe(at - seq.arrival);
        this.stats.queueTime.observe(seq.scheduledAt! - seq.arrival);
        this.stats.prefillTime.observe(at - seq.scheduledAt!);
      }
      pending.request.onToken(seq.generated - 1);
    },
    onFinish: (seq, at) => {
      const pending = this.pending.get(seq)!;
      this.pending.delete(seq);
      this.stats.finished[seq.finishReason] += 1;
      this.stats.e2eLatency.observe(at - seq.arrival);
      pending.request.onFinish(seq.finishReason);
    },
  };

  private readonly pending = new Map<Sequence, Pending>();

  constructor(readonly options: SimOptions) {
    this.scheduler = new Scheduler({ ...options, reserveFullIsl: !options.firstChunkAdmission });
    this.clock = createClock(options.timeScale);
    this.loop = new EngineLoop(this.scheduler, this.clock, options.timeScale);
  }

  submit(request: GenerationRequest): GenerationHandle {
    const seq = new Sequence(
      request.id,
      request.promptTokens,
      request.outputTokens,
      request.finishReason,
      this.loop.arrivalTime(),
      this.listener,
    );
    this.pending.set(seq, { request });
    this.scheduler.add(seq);
    this.loop.wake();
    return {
      sequence: seq,
      abort: () => {
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
