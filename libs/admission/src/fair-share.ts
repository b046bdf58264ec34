// Fair share among tenants: the Virtual Token Counter (VTC) of Sheng et al., "Fairness in
// Serving Large Language Models" (OSDI 2024), Algorithm 2, in its weighted form.
// Each tenant has a counter of the service it got, in weighted tokens: input tokens charged
// at release (w_p), output tokens as they stream (w_q), both divided by the tenant's weight.
// Output that cannot be seen as it is generated (an answer not streamed) the caller charges
// ahead with `chargeOutput` and settles with `correctOutput` (to the engine's count, or to 0
// for a request that never ran).
// The next release goes to the waiting tenant with the smallest counter.
//
// The lift (Algorithm 2, on a request from a client with nothing queued): a tenant that
// becomes active is raised to max(own, min over the tenants already active), or, when none
// is, to max(own, the counter of the last one served), so time spent idle is not banked.
// The paper applies it per arrival; here it is applied at `pick`, to every tenant waiting
// now that was not waiting at the previous pick, all against the same floor, so the result
// does not depend on the order of `waiting`. The paper's "last client to leave the queue"
// is the tenant picked last (they differ only when its last request was cancelled). The
// per-arrival lift against the other active clients matches the authors' code
// (`Ying1123/VTC-artifact`, slora/server/router/vtc_req_queue.py, `append`); that code has
// no empty-queue branch, so the last-served rule is the paper's text as recalled, unchecked.
//
// Pure: no I/O, no clock; the caller says who is waiting and what was generated.
//
// Counters only grow, but for `refundInput` (the charge of a request that never ran) and
// `correctInput` / `correctOutput` (a charge replaced by the engine's own count). A double holds
// integers exactly up to 2^53 (9e15): at 100k weighted tokens a second that is about 2,800 years, and rounding of fractional weights stays far
// below one token long before that, so no rebasing is done.

export interface FairShareOptions {
  /** Tenant -> weight (> 0). Tenants not listed count with weight 1. */
  weights: ReadonlyMap<string, number>;
  /** VTC's w_p and w_q; defaults 1 and 2. */
  inputWeight?: number;
  outputWeight?: number;
}

/** What `pick` remembers between calls, for a restore: see the constructor. */
export interface FairShareState {
  /** The tenants waiting at the last pick. */
  active: readonly string[];
  /** The tenant picked last. */
  lastServed?: string;
}

const defaults = { inputWeight: 1, outputWeight: 2 } as const;

export class VirtualTokenCounter {
  readonly #weights: ReadonlyMap<string, number>;
  readonly #inputWeight: number;
  readonly #outputWeight: number;
  readonly #counters = new Map<string, number>();
  /** The tenants waiting at the previous pick. */
  #active: ReadonlySet<string> = new Set();
  /** The tenant picked last; undefined until this instance has picked once. */
  #lastServed: string | undefined;

  /**
   * `counters` and `state` restore what a previous instance's `snapshot` and `state` gave (a
   * new leader going on from the last one): with the state, the tenants waiting before are
   * known, so none of them is lifted at the first pick.
   */
  constructor(
    options: FairShareOptions,
    counters: Readonly<Record<string, number>> = {},
    state?: FairShareState,
  ) {
    for (const [tenant, weight] of options.weights) {
      if (!(Number.isFinite(weight) && weight > 0)) {
        throw new RangeError(`fair share: weight of tenant "${tenant}" must be > 0, got ${weight}`);
      }
    }
    this.#weights = options.weights;
    this.#inputWeight = nonNegative('inputWeight', options.inputWeight ?? defaults.inputWeight);
    this.#outputWeight = nonNegative('outputWeight', options.outputWeight ?? defaults.outputWeight);
    for (const [tenant, value] of Object.entries(counters)) {
      this.#counters.set(tenant, nonNegative(`counter of tenant "${tenant}"`, value));
    }
    if (state) {
      this.#active = new Set(state.active);
      this.#lastServed = state.lastServed;
    }
  }

  /** Who was waiting at the last pick and who was picked: what `pick` lifts against. */
  state(): FairShareState {
    return {
      active: [...this.#active],
      ...(this.#lastServed === undefined ? {} : { lastServed: this.#lastServed }),
    };
  }

  /**
   * The tenant to release from next among `waiting` (tenants with waiting work, any order, no duplicates),
   * after lifting those that became active since the previous pick; undefined when `waiting` is empty.
   * Ties: the tenant named first in `waiting`.
   */
  pick(waiting: readonly string[]): string | undefined {
    if (new Set(waiting).size !== waiting.length) {
      throw new RangeError(`fair share: waiting names a tenant twice: ${waiting.join(', ')}`);
    }
    this.#lift(waiting);
    this.#active = new Set(waiting);
    let best: string | undefined;
    for (const tenant of waiting) {
      if (best === undefined || this.counter(tenant) < this.counter(best)) best = tenant;
    }
    if (best !== undefined) this.#lastServed = best;
    return best;
  }

  /** Charges a released request's input tokens (prompt estimate). */
  chargeInput(tenant: string, tokens: number): void {
    this.#charge(tenant, nonNegative('input tokens', tokens) * this.#inputWeight);
  }

  /**
   * Takes back `chargeInput` for a request released but never run (its client left, it was
   * cancelled): the tenant got nothing for it. Never below 0; a lift since the charge stays.
   */
  refundInput(tenant: string, tokens: number): void {
    this.correctInput(tenant, tokens, 0);
  }

  /**
   * Replaces the `charged` input of a request (an estimate) with the `actual` count the engine
   * reported once it ran. Never below 0; a lift since the charge stays.
   */
  correctInput(tenant: string, charged: number, actual: number): void {
    this.#correct(tenant, 'input tokens', this.#inputWeight, charged, actual);
  }

  /** As `correctInput`, for output tokens counted as they streamed. */
  correctOutput(tenant: string, charged: number, actual: number): void {
    this.#correct(tenant, 'output tokens', this.#outputWeight, charged, actual);
  }

  /** Charges output tokens as they stream (called many times per request). */
  chargeOutput(tenant: string, tokens: number): void {
    this.#charge(tenant, nonNegative('output tokens', tokens) * this.#outputWeight);
  }

  counter(tenant: string): number {
    return this.#counters.get(tenant) ?? 0;
  }

  /** Plain copy for persistence (a Redis hash); restores through the constructor. */
  snapshot(): Record<string, number> {
    return Object.fromEntries(this.#counters);
  }

  #charge(tenant: string, cost: number): void {
    if (cost === 0) return;
    this.#counters.set(tenant, this.counter(tenant) + cost / (this.#weights.get(tenant) ?? 1));
  }

  #correct(tenant: string, what: string, weight: number, charged: number, actual: number): void {
    const tokens = nonNegative(what, actual) - nonNegative(what, charged);
    if (tokens === 0) return;
    const cost = (tokens * weight) / (this.#weights.get(tenant) ?? 1);
    this.#counters.set(tenant, Math.max(0, this.counter(tenant) + cost));
  }

  #lift(waiting: readonly string[]): void {
    const newcomers = waiting.filter((tenant) => !this.#active.has(tenant));
    if (newcomers.length === 0) return;
    const floor = this.#floor(waiting);
    for (const tenant of newcomers) {
      if (this.counter(tenant) < floor) this.#counters.set(tenant, floor);
    }
  }

  /** What a tenant becoming active is lifted to. */
  #floor(waiting: readonly string[]): number {
    const continuing = waiting.filter((tenant) => this.#active.has(tenant));
    if (continuing.length > 0) return Math.min(...continuing.map((t) => this.counter(t)));
    if (this.#lastServed !== undefined) return this.counter(this.#lastServed);
    // The first pick of an instance restored without its state (a new leader that could
    // not read it): who was active before is unknown, so every waiting tenant counts as returning and they are evened up
    // to the highest among them. A tenant that was active keeps its place within the bound
    // (its counter was at most the bound above the others'); one that was idle, however low
    // its stale counter, does not get the engine to itself for the whole gap.
    return Math.max(0, ...waiting.map((t) => this.counter(t)));
  }
}

/**
 * VTC's bound on the counter gap of two backlogged tenants for the given per-request maxima and concurrency.
 *
 * Let U = (w_p * maxInput + w_q * concurrency * maxOutput) / weight. When a tenant is picked
 * its counter is the smallest among the waiting ones; after that it grows by one request's
 * input and by the output of at most `concurrency` requests in flight, so it stays at most U
 * above every tenant that kept waiting. Lifts keep a tenant that becomes active at or above
 * the smallest active counter, so for two tenants f and g waiting at every pick from t1 to t,
 * c_f - c_g lies in [-U_g, U_f] at both ends and their weighted service over [t1, t] differs
 * by at most U_f + U_g <= 2U at the smallest weight. This is the paper's 2U bound on two
 * backlogged clients with its batch memory M read as concurrency * maxOutput (a cap of slots,
 * not of KV tokens), derived again here for this release model.
 */
export function fairShareBound(args: {
  maxInputTokens: number;
  maxOutputTokens: number;
  concurrency: number;
  inputWeight?: number;
  outputWeight?: number;
  minWeight?: number;
}): number {
  const maxInput = nonNegative('maxInputTokens', args.maxInputTokens);
  const maxOutput = nonNegative('maxOutputTokens', args.maxOutputTokens);
  const concurrency = nonNegative('concurrency', args.concurrency);
  const wp = nonNegative('inputWeight', args.inputWeight ?? defaults.inputWeight);
  const wq = nonNegative('outputWeight', args.outputWeight ?? defaults.outputWeight);
  const minWeight = args.minWeight ?? 1;
  if (!(Number.isFinite(minWeight) && minWeight > 0)) {
    throw new RangeError(`fair share: minWeight must be > 0, got ${minWeight}`);
  }
  return (2 * (wp * maxInput + wq * concurrency * maxOutput)) / minWeight;
}

function nonNegative(what: string, value: number): number {
  if (!(Number.isFinite(value) && value >= 0)) {
    throw new RangeError(`fair share: ${what} must be a finite number >= 0, got ${value}`);
  }
  return value;
}
