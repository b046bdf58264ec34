// One request as the scheduler sees it (vllm/v1/request.py `Request`, reduced).
import type { CacheHolder } from './kv-cache.js';

export interface SequenceListener {
  /** One output token was sampled at simulated time `at`. */
  onToken(seq: Sequence, at: number): void;
  /** The sequence finished at `at` (not called for aborts). */
  onFinish(seq: Sequence, at: number): void;
}

export type FinishReason = 'stop' | 'length';
export type SequenceState = 'waiting' | 'running' | 'finished' | 'aborted';

export interface SequenceOptions {
  /** `priority` request field: lower runs first under the priority policy (vLLM default 0). */
  priority?: number;
  /** Chained hashes of the prompt's full blocks (see prefix-hash.ts); none: never cached. */
  blockHashes?: readonly string[];
}

export class Sequence implements CacheHolder {
  state: SequenceState = 'waiting';
  /** Tokens whose KV is computed (prompt and output). */
  computed = 0;
  /** Output tokens sampled so far. */
  generated = 0;
  /** KV block ids held, in token order. */
  blockIds: number[] = [];
  preemptions = 0;
  /** Prompt tokens found in the prefix cache when first scheduled (vLLM `num_cached_tokens`). */
  cachedTokens = -1;
  /** Prompt tokens actually computed (prefill work done, recomputation included). */
  prefilledTokens = 0;
  scheduledAt: number | undefined;
  firstTokenAt: number | undefined;
  lastTokenAt: number | undefined;
  finishedAt: number | undefined;
  readonly priority: number;
  readonly blockHashes: readonly string[];

  constructor(
    readonly id: string,
    readonly promptTokens: number,
    /** Output tokens this sequence will produce before it finishes. */
    readonly outputTokens: number,
    readonly finishReason: FinishReason,
    readonly arrival: number,
    readonly listener: SequenceListener,
    options: SequenceOptions = {},
  ) {
    this.priority = options.priority ?? 0;
    this.blockHashes = options.blockHashes ?? [];
  }

  /** Tokens the sequence holds in total: the prompt and every sampled token (`num_tokens`). */
  get length(): number {
    return this.promptTokens + this.generated;
  }

  /** KV blocks held. */
  get blocks(): number {
    return this.blockIds.length;
  }
}
