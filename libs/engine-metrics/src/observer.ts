import { performance } from 'node:perf_hooks';
import { Client } from 'undici';
import { PrometheusParseError } from './errors.js';
import { parseExposition } from './parse.js';
import { readVllmState, VllmMetricsError, type VllmState } from './vllm.js';

export type EngineHealth = 'unknown' | 'healthy' | 'stale';

/** What an observer knows about its engine. Each update is a new frozen object. */
export interface ObservedEngine {
  readonly name: string;
  /** `unknown` until the first scrape ends; `stale` after `staleAfterFailures` failures in a row. */
  readonly health: EngineHealth;
  /** The last successful reading; kept while stale, so its age (`scrapedAt`) tells how old it is. */
  readonly vllm?: VllmState;
  /** Unix ms (from `now`) of the last successful scrape. */
  readonly scrapedAt?: number;
  /**
   * Unix ms (from `now`) at which that scrape's request was sent: the engine's gauges describe
   * a moment between this and `scrapedAt`.
   */
  readonly scrapeSentAt?: number;
  readonly consecutiveFailures: number;
  /**
   * The last scrape got a 200 with metrics that are not vLLM's (a wrong URL, another server).
   * Any other outcome clears it, a failure too: an engine that stopped answering (refused,
   * timed out, 5xx) is stale, not "not vLLM", and the alert on this names the wrong fault.
   */
  readonly degraded: boolean;
  /** Why the last scrape failed; absent after a success. */
  readonly lastError?: string;
  /** Times the engine entered `stale` (once per transition, not once per failure). */
  readonly staleTransitions: number;
}

export interface EngineObserverOptions {
  /** The engine's name, for metrics and logs. */
  name: string;
  /** The engine's base URL (`http://host:8000`); `/metrics` is appended to its path. */
  url: string;
  /** Time between the starts of two scrapes, in ms (at least, never overlapping). */
  intervalMs: number;
  /** Consecutive failed scrapes that make the engine `stale`. */
  staleAfterFailures: number;
  /** Deadline for one whole scrape (connect, head and body), in ms. Default 2000, whatever the interval. */
  timeoutMs?: number;
  /** Sent as `Authorization: Bearer <apiKey>`. */
  apiKey?: string;
  /** Clock for `scrapedAt`. Default `Date.now`. */
  now?: () => number;
}

export interface EngineObserver {
  /** Scrapes once, then every `intervalMs`. Resolves after the first scrape, whatever its outcome. */
  start(): Promise<void>;
  /** Stops scraping, aborts a scrape in flight and closes the connection. No events after it resolves. */
  stop(): Promise<void>;
  readonly state: ObservedEngine;
  /** `cb` runs after every scrape (and so after every transition) with the new state. */
  on(event: 'change', cb: (state: ObservedEngine) => void): void;
  off(event: 'change', cb: (state: ObservedEngine) => void): void;
}

/** Largest `/metrics` body accepted; a busy four-rank vLLM writes about 100 KB. */
const MAX_BODY_BYTES = 16 * 1024 * 1024;

function positiveInteger(name: string, value: unknown, min: number): number {
  if (typeof value !== 'number' || !Number.isSafeInteger(value) || value < min)
    throw new RangeError(`${name} must be an integer >= ${min}, got ${String(value)}`);
  return value;
}

function metricsUrl(base: string): URL {
  let url: URL;
  try {
    url = new URL(base);
  } catch {
    throw new TypeError(`url must be an absolute http(s) URL, got ${JSON.stringify(base)}`);
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:')
    throw new TypeError(`url must be an absolute http(s) URL, got ${JSON.stringify(base)}`);
  url.pathname = `${url.pathname.replace(/\/+$/, '')}/metrics`;
  url.search = '';
  url.hash = '';
  return url;
}

/** One line for a failed request: the error's code and message, or its first cause's. */
function describeError(error: unknown): string {
  if (!(error instanceof Error)) return String(error);
  // Node's happy-eyeballs connect gives an AggregateError with an empty message.
  if (error.message === '' && error instanceof AggregateError && error.errors.length > 0)
    return describeError(error.errors[0]);
  const code = (error as { code?: unknown }).code;
  return typeof code === 'string' && !error.message.includes(code)
    ? `${code}: ${error.message}`
    : error.message || error.name;
}

/**
 * A scrape's deadline when none is given, whatever the interval. Scrapes never overlap (the
 * next starts when this one ends, if that is later than its turn), so a deadline as short as
 * the interval bought nothing, and it failed every scrape of an engine whose /metrics takes a
 * little longer than the interval: a vLLM under load answers it from a busy API server, and
 * the 500 ms default interval then made the engine stale when it was busiest.
 */
export const DEFAULT_SCRAPE_TIMEOUT_MS = 2000;

type Outcome =
  { ok: true; vllm: VllmState; sentAt: number } | { ok: false; error: string; notVllm: boolean };

export function createEngineObserver(options: EngineObserverOptions): EngineObserver {
  if (typeof options.name !== 'string' || options.name === '')
    throw new TypeError('name must be a non-empty string');
  const target = metricsUrl(options.url);
  const intervalMs = positiveInteger('intervalMs', options.intervalMs, 1);
  const staleAfterFailures = positiveInteger('staleAfterFailures', options.staleAfterFailures, 1);
  const timeoutMs = positiveInteger('timeoutMs', options.timeoutMs ?? DEFAULT_SCRAPE_TIMEOUT_MS, 1);
  const now = options.now ?? Date.now;
  const path = target.pathname;
  // For lastError: the URL without any user:password it may carry.
  const shown = `${target.origin}${target.pathname}`;
  const headers: Record<string, string> = { accept: 'text/plain;version=0.0.4;q=1,*/*;q=0.1' };
  if (options.apiKey !== undefined) headers['authorization'] = `Bearer ${options.apiKey}`;

  // Its own connection, apart from the request path's: a scrape never waits behind a
  // long completion stream, and a stuck engine connection never blocks a scrape's timeout.
  const client = new Client(target.origin, {
    connectTimeout: timeoutMs,
    headersTimeout: timeoutMs,
    bodyTimeout: timeoutMs,
    maxResponseSize: MAX_BODY_BYTES,
    pipelining: 1,
  });

  let state: ObservedEngine = Object.freeze({
    name: options.name,
    health: 'unknown',
    consecutiveFailures: 0,
    degraded: false,
    staleTransitions: 0,
  });
  const listeners = new Set<(s: ObservedEngine) => void>();
  let started: Promise<void> | undefined;
  let stopped = false;
  let timer: NodeJS.Timeout | undefined;
  let inFlight: Promise<void> | undefined;
  const stopController = new AbortController();

  /** One GET of /metrics, read as vLLM; undefined when `stop()` cut it short. */
  async function fetchOnce(): Promise<Outcome | undefined> {
    const deadline = new AbortController();
    const timeout = setTimeout(
      () => deadline.abort(new Error(`timed out after ${timeoutMs} ms`)),
      timeoutMs,
    );
    const signal = AbortSignal.any([deadline.signal, stopController.signal]);
    const sentAt = now();
    try {
      const response = await client.request({ path, method: 'GET', headers, signal });
      if (response.statusCode !== 200) {
        await response.body.dump();
        return { ok: false, error: `HTTP ${response.statusCode}`, notVllm: false };
      }
      const text = await response.body.text();
      const vllm = readVllmState(parseExposition(text));
      return { ok: true, vllm, sentAt };
    } catch (error) {
      if (stopped) return undefined;
      if (error instanceof VllmMetricsError)
        return { ok: false, error: error.message, notVllm: error.code === 'ERR_NOT_VLLM' };
      if (error instanceof PrometheusParseError)
        return { ok: false, error: `bad exposition: ${error.message}`, notVllm: false };
      const reason = deadline.signal.aborted
        ? (deadline.signal.reason as Error).message
        : describeError(error);
      return { ok: false, error: reason, notVllm: false };
    } finally {
      clearTimeout(timeout);
    }
  }

  function apply(outcome: Outcome): void {
    if (outcome.ok) {
      Object.freeze(outcome.vllm.models);
      state = Object.freeze({
        name: options.name,
        health: 'healthy',
        vllm: Object.freeze(outcome.vllm),
        scrapedAt: now(),
        scrapeSentAt: outcome.sentAt,
        consecutiveFailures: 0,
        degraded: false,
        staleTransitions: state.staleTransitions,
      });
    } else {
      const consecutiveFailures = state.consecutiveFailures + 1;
      const becomesStale = state.health !== 'stale' && consecutiveFailures >= staleAfterFailures;
      const next: ObservedEngine = {
        ...state,
        health: becomesStale ? 'stale' : state.health,
        consecutiveFailures,
        degraded: outcome.notVllm,
        lastError: `GET ${shown}: ${outcome.error}`,
        staleTransitions: state.staleTransitions + (becomesStale ? 1 : 0),
      };
      state = Object.freeze(next);
    }
    const snapshot = state;
    for (const listener of [...listeners]) {
      try {
        listener(snapshot);
      } catch (error) {
        // A listener's bug must not stop the scrape loop, nor be swallowed.
        queueMicrotask(() => {
          throw error;
        });
      }
    }
  }

  async function scrape(): Promise<void> {
    const outcome = await fetchOnce();
    if (outcome === undefined || stopped) return;
    apply(outcome);
  }

  function runScrape(): Promise<void> {
    const began = performance.now();
    inFlight = scrape().finally(() => {
      inFlight = undefined;
      if (stopped) return;
      // The next scrape starts intervalMs after this one started, or at once if this one
      // took longer; never two at a time.
      const delay = Math.max(0, intervalMs - (performance.now() - began));
      timer = setTimeout(() => {
        timer = undefined;
        void runScrape();
      }, delay);
      // A poller alone must not keep the process alive; `stop()` is still the way out.
      timer.unref();
    });
    return inFlight;
  }

  return {
    start() {
      if (stopped) return Promise.reject(new Error(`observer ${options.name} was stopped`));
      started ??= runScrape();
      return started;
    },
    async stop() {
      if (stopped) return;
      stopped = true;
      if (timer !== undefined) clearTimeout(timer);
      timer = undefined;
      stopController.abort(new Error('observer stopped'));
      await inFlight;
      await client.destroy();
    },
    // eslint-disable-next-line no-restricted-syntax -- made once per observer, not per scrape
    get state() {
      return state;
    },
    on(event, cb) {
      if (event !== 'change') throw new TypeError(`unknown event ${String(event)}`);
      listeners.add(cb);
    },
    off(event, cb) {
      if (event !== 'change') throw new TypeError(`unknown event ${String(event)}`);
      listeners.delete(cb);
    },
  };
}
