// How long one scheduler step takes on the simulated GPU.
//
// step = overhead + sum over prefill chunks of prefillSeconds(start, tokens)
//        + decoding sequences x decodeSecondsPerSequence
//
// A prefill token at context position p costs 1 / prefillTokensPerSecond (the weights:
// linear in tokens) plus p x prefillContextCost (causal attention reads every earlier
// token: quadratic over a prompt). A chunk covering positions [s, s + n) therefore costs
//   n / R + c x ((s + n)^2 - s^2) / 2
// and a whole uncached prompt of L tokens L / R + c L^2 / 2, the same whatever the chunking.

export interface CostConfig {
  stepOverheadSeconds: number;
  /** Prefill rate at context position 0 (tokens per simulated second). */
  prefillTokensPerSecond: number;
  /** Seconds added to one prefill token's cost per token of context before it. */
  prefillContextCost: number;
  decodeSecondsPerSequence: number;
}

/** Simulated seconds to prefill positions [start, start + tokens) of one sequence. */
export function prefillSeconds(c: CostConfig, start: number, tokens: number): number {
  const end = start + tokens;
  return (
    tokens / c.prefillTokensPerSecond + (c.prefillContextCost * (end * end - start * start)) / 2
  );
}

export interface StepWork {
  /** Context position of the chunk's first token. */
  start: number;
  tokens: number;
  decode: boolean;
}

export function stepSeconds(c: CostConfig, work: readonly StepWork[]): number {
  let seconds = c.stepOverheadSeconds;
  for (const w of work) {
    seconds += w.decode ? c.decodeSecondsPerSequence : prefillSeconds(c, w.start, w.tokens);
  }
  return seconds;
}
