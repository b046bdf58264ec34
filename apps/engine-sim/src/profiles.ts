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
  /** Uncached prefill throughput, tokens per simulated second. */
  prefillTokensPerSecond: number;
  /** Added step time per sequence decoding in that step, simulated seconds. */
  decodeSecondsPerSequence: number;
  /** Natural answer length (before `max_tokens`) is drawn from this range by the request's seed. */
  outputLenMin: number;
  outputLenMax: number;
}

export const profiles = {
  // The engine of the reference PR: PP=2 across two consumer GPUs, `--max-num-seqs 4`,
  // `vllm:cache_config_info{num_gpu_blocks="9527",block_size="16"}` = 152,432 KV tokens,
  // uncached prefill ~525 tok/s (7-day mean of request_prefill_time_seconds). A 65k-token
  // prompt takes ~125 s of prefill at that rate and holds the whole step budget meanwhile,
  // so other sequences get one token per ~3.9 s step: generation throughput near zero.
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
  // KV (~2k tokens x 128 KiB at 3.35 TB/s = ~0.08 ms per sequence).
  datacenter: {
    model: 'meta-llama/Llama-3.1-8B-Instruct',
    maxNumSeqs: 256,
    maxNumBatchedTokens: 8192,
    numGpuBlocks: 27500,
    blockSize: 16,
    maxModelLen: 131072,
    stepOverheadSeconds: 0.005,
    prefillTokensPerSecond: 30000,
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
    decodeSecondsPerSequence: 0,
    outputLenMin: 16,
    outputLenMax: 64,
  },
} as const satisfies Record<string, EngineProfile>;

export type ProfileName = keyof typeof profiles;

export const profileNames = Object.keys(profiles) as ProfileName[];
