// Faults a test can switch on at run time through PUT /sim/faults.

export interface Faults {
  /** `/metrics`: answer normally, fail with 500, answer after `metricsDelayMs`, or answer 200 with text that is not vLLM's. */
  metrics: 'ok' | 'error' | 'slow' | 'not-vllm';
  metricsDelayMs: number;
  /** Share (0..1) of completion requests answered 500, spread evenly rather than randomly. */
  errorRate: number;
  /** Streams have their connection destroyed after this many tokens; null = never. */
  dropStreamAfterTokens: number | null;
  /** False: /health answers 503 and completion requests are refused, as while vLLM loads. */
  ready: boolean;
  /**
   * True: the step in progress does not end, and no other starts, until set back to false: a
   * step slower than any threshold (a long prefill chunk on slow hardware, a GPU hang).
   */
  holdStep: boolean;
}

export const defaultFaults: Faults = {
  metrics: 'ok',
  metricsDelayMs: 0,
  errorRate: 0,
  dropStreamAfterTokens: null,
  ready: true,
  holdStep: false,
};

const isNonNegative = (v: unknown) => typeof v === 'number' && Number.isFinite(v) && v >= 0;

const validators: { [K in keyof Faults]: [(v: unknown) => boolean, string] } = {
  metrics: [
    (v) => v === 'ok' || v === 'error' || v === 'slow' || v === 'not-vllm',
    "one of 'ok', 'error', 'slow', 'not-vllm'",
  ],
  metricsDelayMs: [isNonNegative, 'a number >= 0'],
  errorRate: [(v) => isNonNegative(v) && (v as number) <= 1, 'a number from 0 to 1'],
  dropStreamAfterTokens: [
    (v) => v === null || (Number.isInteger(v) && (v as number) >= 0),
    'null or an integer >= 0',
  ],
  ready: [(v) => typeof v === 'boolean', 'a boolean'],
  holdStep: [(v) => typeof v === 'boolean', 'a boolean'],
};

/** Applies a partial update; throws with the field and what is allowed on bad input. */
export function patchFaults(current: Faults, patch: unknown): Faults {
  if (typeof patch !== 'object' || patch === null || Array.isArray(patch))
    throw new Error('faults must be a JSON object');
  const next = { ...current };
  for (const [key, value] of Object.entries(patch)) {
    const validator = validators[key as keyof Faults];
    if (!validator)
      throw new Error(
        `unknown fault ${JSON.stringify(key)}; known: ${Object.keys(validators).join(', ')}`,
      );
    if (!validator[0](value))
      throw new Error(`fault ${key} must be ${validator[1]}, got ${JSON.stringify(value)}`);
    (next as Record<string, unknown>)[key] = value;
  }
  return next;
}

/** Spreads failures evenly: with rate 0.25 exactly every fourth request fails. */
export class ShareCounter {
  private credit = 0;

  take(rate: number): boolean {
    if (rate <= 0) return false;
    this.credit += rate;
    if (this.credit >= 1 - 1e-9) {
      this.credit -= 1;
      return true;
    }
    return false;
  }
}
