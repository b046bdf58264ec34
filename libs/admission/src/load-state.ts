// The load state behind degradation (DESIGN, Policy: degradation): a raw load reading is
// smoothed with an EMA and mapped to a profile (normal, tired, lazy, ...) with hysteresis, so
// a signal hovering at a threshold does not flip the state on every reading. Pure: readings
// and the previous state come in as arguments; nothing reads a clock or keeps global state.

export interface LoadProfile {
  name: string;
  /** The state is entered when the smoothed signal is at or above this (0..1); the first profile has 0. */
  threshold: number;
  /** System instruction added to requests released in this state; none for the first profile. */
  instruction?: string;
  /** `max_tokens` is multiplied by this, in (0, 1]; 1 leaves it untouched. */
  maxTokensFactor: number;
}

export interface LoadStateOptions {
  /** Ascending thresholds, the first at 0. */
  profiles: readonly LoadProfile[];
  /** EMA weight of a new reading, in (0, 1]; 1 means no smoothing. The config's default is 0.3. */
  alpha: number;
  /**
   * Margin, >= 0 (the config's default is 0.05). Going UP to state j needs a smoothed value
   * >= `profiles[j].threshold`; going DOWN from state i needs a smoothed value below
   * `profiles[i].threshold - hysteresis`.
   */
  hysteresis: number;
}

export interface LoadState {
  /** The EMA of the readings so far; undefined until the first reading. */
  smoothed: number | undefined;
  /** Index of the current profile in `LoadStateOptions.profiles`. */
  index: number;
  /** How many times `index` has changed (a jump over several states counts once). */
  changes: number;
}

export type LoadSignalSource = 'kv' | 'gpu' | 'queue';

export interface LoadInputs {
  /** The engine's KV-cache usage, 0..1. */
  kvUsage?: number;
  /** GPU utilization, 0..1. */
  gpuUtilization?: number;
  /** Queued requests / the pool's queue depth, capped at 1. */
  queuePressure?: number;
}

/** No reading yet: the first profile, nothing smoothed. */
export function initialLoadState(): LoadState {
  return { smoothed: undefined, index: 0, changes: 0 };
}

const clamp01 = (value: number) => (value <= 0 ? 0 : value > 1 ? 1 : value);

/** The highest profile whose threshold is at or below `value` (0 when none is). */
function highestReached(profiles: readonly LoadProfile[], value: number): number {
  for (let i = profiles.length - 1; i > 0; i -= 1)
    if (value >= (profiles[i] as LoadProfile).threshold) return i;
  return 0;
}

/**
 * The state after one reading. `signal` is the raw load, 0..1 (values outside are clamped);
 * `undefined` or a non-finite number means "no reading" and returns `state` itself.
 *
 * The first reading initialises the EMA; later ones blend in as
 * `smoothed = alpha * signal + (1 - alpha) * smoothed`. Then:
 * - up: if some profile above the current one has `threshold <= smoothed`, the state is the
 *   highest such profile (several states at once if need be);
 * - down: otherwise the state steps down from i while `smoothed < profiles[i].threshold -
 *   hysteresis`, i.e. it ends in the highest profile j <= i with
 *   `smoothed >= profiles[j].threshold - hysteresis`.
 * So a change in the opposite direction of the previous change needs the smoothed value to
 * have moved by more than `hysteresis` since then. Throws a RangeError for options no
 * configuration can produce (no profiles, alpha outside (0, 1], negative hysteresis).
 */
export function nextLoadState(
  state: LoadState,
  signal: number | undefined,
  options: LoadStateOptions,
): LoadState {
  const { profiles, alpha, hysteresis } = options;
  if (profiles.length === 0) throw new RangeError('load state: at least one profile is needed');
  if (!(alpha > 0 && alpha <= 1))
    throw new RangeError(`load state: alpha must be in (0, 1], got ${alpha}`);
  if (!(hysteresis >= 0 && Number.isFinite(hysteresis)))
    throw new RangeError(`load state: hysteresis must be >= 0, got ${hysteresis}`);
  if (signal === undefined || !Number.isFinite(signal)) return state;

  const reading = clamp01(signal);
  const previous = state.smoothed;
  let smoothed = reading;
  if (previous !== undefined) {
    // Kept between the previous value and the reading, also under rounding, so the EMA never
    // leaves the range of the readings it has seen.
    const low = Math.min(previous, reading);
    const high = Math.max(previous, reading);
    smoothed = Math.min(high, Math.max(low, alpha * reading + (1 - alpha) * previous));
  }

  const current = Math.min(Math.max(0, state.index), profiles.length - 1);
  const reached = highestReached(profiles, smoothed);
  let index = current;
  if (reached > current) index = reached;
  else
    while (index > reached && smoothed < (profiles[index] as LoadProfile).threshold - hysteresis)
      index -= 1;

  return { smoothed, index, changes: state.changes + (index === state.index ? 0 : 1) };
}

/**
 * The raw load signal: the maximum of the selected inputs that are available (finite),
 * each clamped to 0..1; undefined when none of them is.
 */
export function loadSignal(
  inputs: LoadInputs,
  sources: readonly LoadSignalSource[],
): number | undefined {
  let signal: number | undefined;
  for (const source of sources) {
    const value =
      source === 'kv'
        ? inputs.kvUsage
        : source === 'gpu'
          ? inputs.gpuUtilization
          : inputs.queuePressure;
    if (value === undefined || !Number.isFinite(value)) continue;
    const clamped = clamp01(value);
    if (signal === undefined || clamped > signal) signal = clamped;
  }
  return signal;
}
