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
 * Smoothed prefill rate, tokens per second. Two sources: long prompts streamed through this
 * dispatcher (release to first byte: exactly what "in prefill" means here), and, until one has
 * been, the engines' own finished requests (the growth of `vllm:request_prompt_tokens_sum`
 * over that of `vllm:request_prefill_time_seconds_sum` between scrapes; short requests weigh
 * in too, which makes it err slow, i.e. toward holding long prompts back).
 */
export class PrefillRate {
  /** From long prompts streamed through this dispatcher. */
  value: number | undefined;
  /** From the engines' own histograms. */
  engineValue: number | undefined;

  constructor(private readonly alpha = 0.3) {}

  /** The rate the rules use: the streamed measurement, else the engines'. */
  get current(): number | undefined {
    return this.value ?? this.engineValue;
  }

  sample(tokens: number, seconds: number): void {
    this.value = this.blend(this.value, tokens, seconds);
  }

  sampleEngine(tokens: number, seconds: number): void {
    this.engineValue = this.blend(this.engineValue, tokens, seconds);
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
