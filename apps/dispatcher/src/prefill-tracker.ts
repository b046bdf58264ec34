// What the prefill rules need to know about released work, per engine: long prompts in flight
// and in prefill, the KV the last scrape cannot show yet, and the measured prefill rate.
//
// "In prefill" runs from release to the first byte of the engine's body. vLLM sends a streaming
// response's head at once and its first bytes with the first token (the simulator does the
// same), so for a stream the first body byte is the end of the prefill. A non-streaming answer
// has no such signal: it counts as in prefill until its estimated prefill time (tokens / the
// rate measured on streams) has passed, or until it completes when no rate is measured yet.
import type { PrefillView } from '@sluice/admission';
import type { LongPromptStats } from '@sluice/protocol';

/** The per-engine counters a `PrefillView` carries, kept by this module. */
export type PrefillCounters = Pick<
  PrefillView,
  'longInflight' | 'longInPrefill' | 'kvPendingTokens' | 'kvCapacityTokens'
> & {
  /** Estimated prompt tokens of long prompts in prefill (part of `kvPendingTokens`). */
  prefillTokens: number;
  /** Tokens released since the last scrape that are not in `prefillTokens`. */
  sinceScrapeTokens: number;
};

export function emptyCounters(): PrefillCounters {
  return {
    longInflight: 0,
    longInPrefill: 0,
    kvPendingTokens: 0,
    prefillTokens: 0,
    sinceScrapeTokens: 0,
  };
}

function settle(c: PrefillCounters): void {
  c.kvPendingTokens = c.prefillTokens + c.sinceScrapeTokens;
}

/** A new scrape: what was released before it is in its gauges now. */
export function scraped(c: PrefillCounters, kvCapacityTokens: number | undefined): void {
  c.sinceScrapeTokens = 0;
  if (kvCapacityTokens === undefined) delete c.kvCapacityTokens;
  else c.kvCapacityTokens = kvCapacityTokens;
  settle(c);
}

/** Smoothed long-prompt prefill rate, tokens per second. */
export class PrefillRate {
  value: number | undefined;

  constructor(private readonly alpha = 0.3) {}

  sample(tokens: number, seconds: number): void {
    if (!(tokens > 0) || !(seconds > 0)) return;
    const rate = tokens / seconds;
    this.value = this.value === undefined ? rate : this.value + this.alpha * (rate - this.value);
  }
}

export interface ReleasedWork {
  /** The first body byte arrived (streams) or the estimated prefill time passed. */
  firstByte(now: number): void;
  /** The request ended, however. */
  finished(): void;
  /** Estimated prefill tokens this request likely has left. */
  remainingTokens(now: number): number;
  readonly long: boolean;
  readonly inPrefill: boolean;
}

/**
 * Counts one released request on `c`. `changed` runs whenever a counter the gate reads moved
 * (so the release loop can look again).
 */
export function trackRelease(
  c: PrefillCounters,
  opts: {
    long: boolean;
    promptTokens: number;
    stream: boolean;
    releasedAt: number;
    rate: PrefillRate;
    changed: () => void;
  },
): ReleasedWork {
  const { long, promptTokens, stream, releasedAt, rate, changed } = opts;
  let inPrefill = long;
  let done = false;
  let timer: NodeJS.Timeout | undefined;
  if (long) {
    c.longInflight += 1;
    c.longInPrefill += 1;
    c.prefillTokens += promptTokens;
    if (!stream && rate.value !== undefined)
      timer = setTimeout(
        () => {
          if (leavePrefill()) changed();
        },
        (promptTokens / rate.value) * 1000,
      ).unref();
  } else {
    c.sinceScrapeTokens += promptTokens;
  }
  settle(c);

  function leavePrefill(): boolean {
    if (!inPrefill) return false;
    inPrefill = false;
    if (timer) clearTimeout(timer);
    c.longInPrefill -= 1;
    c.prefillTokens -= promptTokens;
    // The engine now holds the whole prompt; the next scrape shows it.
    c.sinceScrapeTokens += promptTokens;
    settle(c);
    return true;
  }

  return {
    long,
    get inPrefill() {
      return inPrefill;
    },
    firstByte(now) {
      if (!leavePrefill()) return;
      if (stream) rate.sample(promptTokens, (now - releasedAt) / 1000);
      changed();
    },
    finished() {
      if (done) return;
      done = true;
      leavePrefill();
      if (long) c.longInflight -= 1;
      changed();
    },
    remainingTokens(now) {
      if (!inPrefill) return 0;
      if (rate.value === undefined) return promptTokens;
      return Math.max(0, promptTokens - (rate.value * (now - releasedAt)) / 1000);
    },
  };
}

/** What the gateways need to estimate a new long prompt's wait (honest waiting). */
export function longPromptStats(opts: {
  held: { count: number; tokens: number };
  released: Iterable<ReleasedWork | undefined>;
  rate: PrefillRate;
  /** Long prompts the pool prefills at once. */
  parallelPrefills: number;
  now: number;
}): LongPromptStats {
  let inPrefill = 0;
  let remaining = 0;
  for (const work of opts.released)
    if (work?.inPrefill) {
      inPrefill += 1;
      remaining += work.remainingTokens(opts.now);
    }
  return {
    held: opts.held.count,
    heldTokens: opts.held.tokens,
    inPrefill,
    prefillRemainingTokens: Math.round(remaining),
    ...(opts.rate.value === undefined ? {} : { prefillTokensPerSecond: opts.rate.value }),
    parallelPrefills: opts.parallelPrefills,
  };
}
