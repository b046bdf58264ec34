// Engine profiles: the numbers that make the simulator behave like one real deployment.
// Every field can be overridden by flag or environment (see options.ts).

export interface EngineProfile {
  /** Served model name (`--served-model-name` in vLLM). */
  model: string;
  /** `--max-num-seqs`: sequences in one batch. */
  maxNumSeqs: number;
  /** `--max-num-batched-tokens`: token budget of one scheduler step. */
  maxNumBatchedTokens: number;
  /** KV cache blocks on the GPU (`vllm:cache_config_info{num_gpu_blocks}`). */
  numGpuBlocks: number;
  /** Tokens per KV block (`--block-size`). */
  blockSize: number;
  /** `--max-model-len`: prompt + completion limit of one request. */
  maxModelLen: number;
  /** Fixed cost of one scheduler step, in simulated seconds. */
  stepOverheadSeconds: number;
  /** Uncached prefill throughput at context position 0, tokens per simulated second. */
  prefillTokensPerSecond: number;
  /**
   * Seconds added to one prefill token's cost per token of context before it (attention is
   * quadratic over a prompt); see cost-model.ts.
   */
  prefillContextCost: number;
  /** Added step time per sequence decoding in that step, simulated seconds. */
  decodeSecondsPerSequence: number;
  /** Natural answer length (before `max_tokens`) is drawn from this range by the request's seed. */
  outputLenMin: number;
  outputLenMax: number;
}

export const profiles = {
  // The engine of the reference PR: PP=2 across two consumer GPUs, `--max-num-seqs 4`,
  // `vllm:cache_config_info{num_gpu_blocks="9527",block_size="16"}` = 152,432 KV tokens.
  // Prefill, measured there: 525 tok/s over 7 days (mostly short prompts), 262 tok/s
  // contended, and "a 65k-token prompt costs ~250 s of prefill". Fitted with cost-model.ts
  // (L tokens cost L / R + c L^2 / 2): R = 525 tok/s at position 0 (the 7-day mean, which
  // short prompts dominate) and c = 5.8e-8 s per token per context token, from 250 s =
  // 65,536 / 525 + c x 65,536^2 / 2. Resulting mean rate of one uncached prompt alone (pure
  // scheduler, 2,048-token steps with their 30 ms overhead): 2k 505 tok/s (4.1 s), 8k 464
  // tok/s (17.7 s), 16k 418 tok/s (39.2 s), 65k 262 tok/s (250 s). While the 65k prompt prefills it holds the whole step budget, so other
  // sequences get one token per 4-13 s step: generation throughput near zero.
  // Decode cost (30 ms + 10 ms per sequence, ~14 tok/s each at 4 sequences) is our estimate
  // for a large model split over two GPUs; the PR does not measure it.
  homelab: {
    model: 'reasoning',
    maxNumSeqs: 4,
    maxNumBatchedTokens: 2048,
    numGpuBlocks: 9527,
    blockSize: 16,
    maxModelLen: 131072,
    stepOverheadSeconds: 0.03,
    prefillTokensPerSecond: 525,
    prefillContextCost: 5.8e-8,
    decodeSecondsPerSequence: 0.01,
    outputLenMin: 32,
    outputLenMax: 512,
  },
  // Llama-3.1-8B-Instruct in BF16 on one H100 80GB SXM with vLLM V1 defaults for the OpenAI
  // server (max_num_seqs 256, max_num_batched_tokens 8192, gpu_memory_utilization 0.9).
  // Derived, not measured here (no GPU on these machines): KV per token = 32 layers x 8 KV
  // heads x 128 dims x 2 (K,V) x 2 bytes = 128 KiB; ~72 GB usable - 16 GB weights - ~2 GB
  // activations leaves ~54 GB = ~440k tokens = 27,500 blocks of 16. Prefill: ~16 GFLOP per
  // token against ~990 TFLOP/s BF16 at ~50% utilisation = ~30k tok/s. Decode is memory
  // bound: 16 GB of weights at 3.35 TB/s = ~5 ms per step, plus reading each sequence's
  // KV (~2k tokens x 128 KiB at 3.35 TB/s = ~0.08 ms per sequence). Attention in prefill:
  // 4 x 32 layers x 4,096 dims = ~0.5 MFLOP per token per context token at ~495 TFLOP/s =
  // ~1e-9 s (at 128k context that is ~4x the weights' cost per token).
  datacenter: {
    model: 'meta-llama/Llama-3.1-8B-Instruct',
    maxNumSeqs: 256,
    maxNumBatchedTokens: 8192,
    numGpuBlocks: 27500,
    blockSize: 16,
    maxModelLen: 131072,
    stepOverheadSeconds: 0.005,
    prefillTokensPerSecond: 30000,
    prefillContextCost: 1e-9,
    decodeSecondsPerSequence: 0.00008,
    outputLenMin: 32,
    outputLenMax: 512,
  },
  // No model latency at all: for measuring what the broker itself costs.
  instant: {
    model: 'sim-instant',
    maxNumSeqs: 256,
    maxNumBatchedTokens: 8192,
    numGpuBlocks: 65536,
    blockSize: 16,
    maxModelLen: 131072,
    stepOverheadSeconds: 0,
    prefillTokensPerSecond: Number.POSITIVE_INFINITY,
    prefillContextCost: 0,
    decodeSecondsPerSequence: 0,
    outputLenMin: 16,
    outputLenMax: 64,
  },
} as const satisfies Record<string, EngineProfile>;

export type ProfileName = keyof typeof profiles;

export const profileNames = Object.keys(profiles) as ProfileName[];
