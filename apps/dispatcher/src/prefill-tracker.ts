// What the prefill rules need to know about released work, per engine: long prompts in flight
// and in prefill, the KV the last scrape cannot show yet, and the measured prefill rate.
//
// "In prefill" runs from release to the first byte of the engine's body. vLLM sends a streaming
// response's head at once and its first bytes with the first token (the simulator does the
// same), so for a 2xx stream the first body byte is the end of the prefill. An error answer's
// body ends it too (the engine holds nothing more of the request) but measures nothing: the
// engine refused before any prefill. A non-streaming answer has no such signal: it counts as in
// prefill until its estimated prefill time (tokens / the measured rate, see PrefillRate) has
// passed, or until it completes while no rate is known.
import type { PrefillView } from '@sluice/admission';
import type { LongPromptStats } from '@sluice/protocol';

/** The per-engine counters a `PrefillView` carries, kept by this module. */
export type PrefillCounters = Pick<
  PrefillView,
  'longInflight' | 'longInPrefill' | 'kvPendingTokens' | 'kvCapacityTokens'
> & {
  /** Long prompts in prefill: the part of their prompt not prefilled yet is KV to come. */
  prefilling: Set<ReleasedWork>;
  /** Tokens released since the last scrape, long prompts' once their prefill ended. */
  sinceScrapeTokens: number;
};

export function emptyCounters(): PrefillCounters {
  return {
    longInflight: 0,
    longInPrefill: 0,
    kvPendingTokens: 0,
    prefilling: new Set(),
    sinceScrapeTokens: 0,
  };
}

/**
 * Brings `kvPendingTokens` up to `now`: what was released since the last scrape, plus what the
 * long prompts in prefill have likely not prefilled yet (their whole prompt while no rate is
 * measured: vLLM allocates a prompt's blocks chunk by chunk, so the gauge shows only the part
 * done). Call before the prefill rules read the engine.
 */
export function settlePending(c: PrefillCounters, now: number): void {
  let pending = c.sinceScrapeTokens;
  for (const work of c.prefilling) pending += work.remainingTokens(now);
  c.kvPendingTokens = pending;
}

/** A new scrape: what was released before it is in its gauges now. */
export function scraped(c: PrefillCounters, kvCapacityTokens: number | undefined): void {
  c.sinceScrapeTokens = 0;
  if (kvCapacityTokens === undefined) delete c.kvCapacityTokens;
  else c.kvCapacityTokens = kvCapacityTokens;
}

/**
 * Smoothed prefill rate, tokens per second. Two sources:
 *
 * - long prompts streamed through this dispatcher (release to first byte: exactly what "in
 *   prefill" means here), `value`;
 * - the engines' own finished requests, between scrapes: the growth of the tokens they
 *   computed over that of `vllm:request_prefill_time_seconds_sum`. Where an engine exports
 *   `vllm:request_prefill_kv_computed_tokens` (vLLM >= 0.13) those tokens leave prefix-cache
 *   hits out, `engineValue`; an older engine has only `vllm:request_prompt_tokens`, hits
 *   included, while the prefill seconds cover only the computed part, so with prefix caching
 *   (vLLM's default) that rate reads fast, `enginePromptValue`, the last resort. Short
 *   requests weigh in too: each costs at least one engine step however few tokens it
 *   computed, so a mostly cached one reads slow in the cache-free rate (toward holding long
 *   prompts back) where it read fast in the prompt-token one.
 *
 * A streamed sample has the same bias as the prompt-token rate: a prompt mostly in the prefix
 * cache sends its first byte after a fraction of a cold prefill, and the dispatcher cannot
 * tell at the first byte (only the answer's `usage.prompt_tokens_details.cached_tokens`
 * says, at its end, and only from an engine run with `--enable-prompt-tokens-details`). One
 * such sample would take the smoothed value to thousands of tokens a second, and a cold long
 * prompt released without a stream would leave "prefill" within a second. So where the
 * engines' cache-free rate is known, the rules use the slower of the two; without it (older
 * vLLM), the streamed rate as measured, which a cached prompt can read fast. Either way the
 * rate is never faster than the streamed one alone, or than the prompt-token one was.
 */
export class PrefillRate {
  /** From long prompts streamed through this dispatcher. */
  value: number | undefined;
  /** From the engines' own histograms, prefix-cache hits excluded. */
  engineValue: number | undefined;
  /** From engines that count prefix-cache hits as prefilled (vLLM < 0.13): reads fast. */
  enginePromptValue: number | undefined;

  constructor(private readonly alpha = 0.3) {}

  /**
   * The rate the rules use: the slower of the streamed measurement and the engines' cache-free
   * rate; either one alone; else the engines' prompt-token rate.
   */
  get current(): number | undefined {
    const { value, engineValue } = this;
    if (value === undefined) return engineValue ?? this.enginePromptValue;
    return engineValue === undefined ? value : Math.min(value, engineValue);
  }

  sample(tokens: number, seconds: number): void {
    this.value = this.blend(this.value, tokens, seconds);
  }

  /** `excludesCached`: the tokens are computed ones, prefix-cache hits left out. */
  sampleEngine(tokens: number, seconds: number, excludesCached: boolean): void {
    if (excludesCached) this.engineValue = this.blend(this.engineValue, tokens, seconds);
    else this.enginePromptValue = this.blend(this.enginePromptValue, tokens, seconds);
  }

  private blend(previous: number | undefined, tokens: number, seconds: number) {
    if (!(tokens > 0) || !(seconds > 0)) return previous;
    const rate = tokens / seconds;
    return previous === undefined ? rate : previous + this.alpha * (rate - previous);
  }
}

export interface ReleasedWork {
  /** The first body byte arrived, under a head of `status`. */
  firstByte(now: number, status: number): void;
  /** The request ended, however. */
  finished(): void;
  /** Estimated prefill tokens this request likely has left. */
  remainingTokens(now: number): number;
  readonly long: boolean;
  readonly inPrefill: boolean;
}

export interface TrackReleaseOptions {
  long: boolean;
  promptTokens: number;
  stream: boolean;
  releasedAt: number;
  rate: PrefillRate;
  changed: () => void;
}

/**
 * Counts one released request on `c`. `changed` runs whenever a counter the gate reads moved
 * (so the release loop can look again).
 */
export function trackRelease(c: PrefillCounters, opts: TrackReleaseOptions): ReleasedWork {
  return new Release(c, opts);
}

/**
 * One released request's prefill tracking. A class, not an object literal with a getter: V8
 * allocates the accessor pair of a literal's getter in the old generation on every
 * evaluation, and that pair keeps the getter's closure, its context and what the context holds
 * through every young-generation collection until the next full one. Made per request, it had
 * the dispatcher promote about 220 KB per young collection at 1,000 requests/s
 * (docs/performance.md, "An accessor in a literal"); a class keeps its getter on the prototype.
 */
class Release implements ReleasedWork {
  readonly long: boolean;
  private prefilling: boolean;
  private done = false;
  private timer: NodeJS.Timeout | undefined;

  constructor(
    private readonly c: PrefillCounters,
    private readonly opts: TrackReleaseOptions,
  ) {
    const { long, promptTokens, stream, rate } = opts;
    this.long = long;
    this.prefilling = long;
    if (!long) {
      c.sinceScrapeTokens += promptTokens;
      return;
    }
    c.longInflight += 1;
    c.longInPrefill += 1;
    c.prefilling.add(this);
    const perSecond = rate.current;
    if (!stream && perSecond !== undefined)
      this.timer = setTimeout(
        () => {
          if (this.leavePrefill()) opts.changed();
        },
        (promptTokens / perSecond) * 1000,
      ).unref();
  }

  get inPrefill(): boolean {
    return this.prefilling;
  }

  firstByte(now: number, status: number): void {
    if (!this.leavePrefill()) return;
    const { stream, rate, promptTokens, releasedAt, changed } = this.opts;
    // Only a 2xx stream's first byte is its first token. An error body (a 400 for a prompt
    // over max_model_len) comes at once, without any prefill: sampled, it read as a rate
    // hundreds of times the engine's, and the gate and the gateways' wait estimates use it.
    if (stream && status >= 200 && status < 300)
      rate.sample(promptTokens, (now - releasedAt) / 1000);
    changed();
  }

  finished(): void {
    if (this.done) return;
    this.done = true;
    this.leavePrefill();
    if (this.long) this.c.longInflight -= 1;
    this.opts.changed();
  }

  remainingTokens(now: number): number {
    if (!this.prefilling) return 0;
    const { rate, promptTokens, releasedAt } = this.opts;
    const perSecond = rate.current;
    if (perSecond === undefined) return promptTokens;
    return Math.max(0, promptTokens - (perSecond * (now - releasedAt)) / 1000);
  }

  private leavePrefill(): boolean {
    if (!this.prefilling) return false;
    this.prefilling = false;
    if (this.timer) clearTimeout(this.timer);
    const c = this.c;
    c.longInPrefill -= 1;
    c.prefilling.delete(this);
    // The engine now holds the whole prompt; the next scrape shows it.
    c.sinceScrapeTokens += this.opts.promptTokens;
    return true;
  }
}

/** What the gateways need to estimate a new long prompt's wait (honest waiting). */
export function longPromptStats(opts: {
  held: { count: number; tokens: number };
  released: Iterable<ReleasedWork>;
  rate: PrefillRate;
  /** Long prompts the pool prefills at once. */
  parallelPrefills: number;
  now: number;
}): LongPromptStats {
  let inPrefill = 0;
  let remaining = 0;
  for (const work of opts.released)
    if (work.inPrefill) {
      inPrefill += 1;
      remaining += work.remainingTokens(opts.now);
    }
  return {
    held: opts.held.count,
    heldTokens: opts.held.tokens,
    inPrefill,
    prefillRemainingTokens: Math.round(remaining),
    ...(opts.rate.current === undefined ? {} : { prefillTokensPerSecond: opts.rate.current }),
    parallelPrefills: opts.parallelPrefills,
  };
}
