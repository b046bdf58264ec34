// One engine of a pool as the dispatcher sees it: its client, what its scrapes say, and the
// counters the gate and the prefill rules read. The in-flight counts are changed only by the
// ledger (ledger.ts); this module turns the engine's scrapes into gauges and metrics.
import {
  bypassTraffic,
  gaugesFrozen,
  unchangedSince,
  type GatePolicy,
  type PrefillView,
} from '@sluice/admission';
import type { EngineConfig } from '@sluice/config';
import {
  createEngineObserver,
  type EngineObserver,
  type ObservedEngine,
  type VllmState,
} from '@sluice/engine-metrics';
import { gaugeSeries, type DispatcherMetrics, type GaugeSeries } from '@sluice/observability';
import { EngineClient, type EngineTimeouts } from './engine-call.js';
import {
  emptyCounters,
  scraped,
  type PrefillCounters,
  type PrefillRate,
} from './prefill-tracker.js';

export interface EngineSlot extends PrefillView, PrefillCounters {
  client: EngineClient;
  observer: EngineObserver;
  /** The observed state behind `gauges` and `health`. */
  observed?: ObservedEngine;
  degraded: boolean;
  /** No cap was set for it: the cap follows the engine's own max_num_seqs once a scrape shows it. */
  capFollowsEngine: boolean;
  /** The engine's max_num_seqs last logged beside a cap someone set (logged once per value). */
  reportedMaxNumSeqs?: number;
  /** The engine's prefill histogram sums at the previous scrape. */
  prefillTotals?: VllmState['prefillTotals'];
  /**
   * The run of identical scrapes (`gauges.unchangedSince`) in which the gauges were found
   * frozen, while it lasts: the warning is logged once per run, and
   * `sluice_engine_gauges_frozen` is 1 until a scrape reads something else.
   */
  frozenSince?: number;
}

export function createEngineSlot(
  config: EngineConfig,
  opts: {
    timeouts: EngineTimeouts;
    scrape: { intervalMs: number; staleAfterFailures: number };
    now: () => number;
  },
): EngineSlot {
  return {
    ...emptyCounters(),
    name: config.name,
    lane: config.lane,
    inflight: 0,
    cap: config.maxInflight,
    capFollowsEngine: config.capSource === 'default',
    health: 'unknown' as const,
    degraded: false,
    client: new EngineClient(config, opts.timeouts),
    observer: createEngineObserver({
      name: config.name,
      url: config.url,
      intervalMs: opts.scrape.intervalMs,
      staleAfterFailures: opts.scrape.staleAfterFailures,
      ...(config.apiKey ? { apiKey: config.apiKey } : {}),
      now: opts.now,
    }),
  };
}

/** Each pool's prefill-rate series: set on every release and end, and by the scrapes. */
const rateSeries = new WeakMap<PrefillRate, GaugeSeries>();

/** The pool's prefill rate, once it is known. */
export function setPrefillRate(metrics: DispatcherMetrics, pool: string, rate: PrefillRate): void {
  if (rate.current === undefined) return;
  let series = rateSeries.get(rate);
  if (!series) {
    series = gaugeSeries(metrics.prefillRate, { pool });
    rateSeries.set(rate, series);
  }
  series.set(rate.current);
}

export interface ObservationDeps {
  pool: string;
  metrics: DispatcherMetrics;
  policy: GatePolicy;
  prefillRate: PrefillRate;
  log: {
    info(o: object, m: string): void;
    warn(o: object, m: string): void;
    error(o: object, m: string): void;
  };
  /** The engine's cap changed (it follows the engine's own --max-num-seqs). */
  capChanged: () => void;
  /** Something the gate reads changed. */
  changed: () => void;
  /** This dispatcher's requests already on `engine`'s connection at `sentAt` (the ledger's count). */
  onEngineBy: (engine: EngineSlot, sentAt: number) => number;
}

/** A new observed state of `engine`: its gauges, health and metrics. */
export function observeEngine(
  deps: ObservationDeps,
  engine: EngineSlot,
  state: ObservedEngine,
): void {
  const { metrics, log } = deps;
  const labels = { pool: deps.pool, engine: engine.name };
  const previous = engine.observed;
  engine.observed = state;
  engine.health = state.health;
  if (state.vllm && state.scrapedAt !== undefined && state.scrapedAt !== previous?.scrapedAt) {
    // The broker's own requests the scrape saw, so they are not counted twice when the gate
    // estimates the traffic that bypassed it. The engine's numbers describe one moment between
    // sending the scrape and reading its answer; of ours, only those handed to the engine
    // before it was sent and still running when it was read were surely on the engine then.
    // Counting just those errs toward too much bypass traffic (holding back), never too
    // little: a job released during the scrape, or still in the runner's own checks, is not
    // taken for one the engine counted.
    const reading = {
      running: state.vllm.running,
      waiting: state.vllm.waiting,
      kvUsage: state.vllm.kvUsage,
      at: state.scrapedAt,
      ...(state.vllm.steps === undefined ? {} : { steps: state.vllm.steps }),
    };
    engine.gauges = {
      ...reading,
      inflightAtScrape: deps.onEngineBy(engine, state.scrapeSentAt ?? state.scrapedAt),
      // Since when the engine has shown no progress (libs/admission frozen.ts): the gate counts
      // gauges unchanged that long as frozen, and lets one probe through.
      unchangedSince: unchangedSince(engine.gauges, reading),
    };
    // A request runs on one data-parallel rank, so it has to fit there, not in the sum.
    scraped(engine, state.vllm.kvRankCapacityTokens);
    samplePrefillRate(deps, engine, state.vllm.prefillTotals);
    metrics.engineRunning.set(labels, state.vllm.running);
    metrics.engineWaiting.set(labels, state.vllm.waiting);
    metrics.engineKvUsage.set(labels, state.vllm.kvUsage);
    metrics.engineBypass.set(labels, bypassTraffic(engine.gauges));
    metrics.engineLastScrape.set(labels, state.scrapedAt / 1000);
    checkMaxNumSeqs(deps, engine, state.vllm.maxNumSeqs);
    checkFrozen(deps, engine, engine.gauges);
  }
  metrics.engineUp.set(labels, state.health === 'healthy' ? 1 : 0);
  if (previous && state.staleTransitions > previous.staleTransitions) {
    metrics.engineStale.inc(labels, state.staleTransitions - previous.staleTransitions);
    log.warn(
      { ...labels, failures: state.consecutiveFailures, err: state.lastError },
      'engine state stale: gauge conditions now follow ADMISSION_FAIL_MODE',
    );
  }
  if (state.degraded !== engine.degraded) {
    engine.degraded = state.degraded;
    metrics.observerDegraded.set(labels, state.degraded ? 1 : 0);
    if (state.degraded)
      log.error(
        { ...labels, err: state.lastError },
        'engine /metrics answers but does not look like vLLM: gating on the in-flight cap only',
      );
  }
  deps.changed();
}

/**
 * The engine's own prefill rate since the previous scrape (see PrefillRate): the growth of the
 * tokens it computed for the requests finished meanwhile over that of their prefill seconds.
 * Where the engine exports `vllm:request_prefill_kv_computed_tokens` (vLLM >= 0.13) those
 * tokens leave prefix-cache hits out; an older engine has only its prompt tokens, hits
 * included, and with prefix caching that rate reads fast (see libs/engine-metrics vllm.ts).
 * Two scrapes of different kinds (the engine was upgraded, or the family was unreadable once)
 * are not differenced.
 */
function samplePrefillRate(
  deps: ObservationDeps,
  engine: EngineSlot,
  totals: VllmState['prefillTotals'],
): void {
  const previous = engine.prefillTotals;
  engine.prefillTotals = totals;
  if (!totals || !previous || totals.excludesCached !== previous.excludesCached) return;
  deps.prefillRate.sampleEngine(
    totals.tokens - previous.tokens,
    totals.seconds - previous.seconds,
    totals.excludesCached,
  );
  setPrefillRate(deps.metrics, deps.pool, deps.prefillRate);
}

/**
 * Frozen gauges (libs/admission gate.ts), at a scrape: a new reading ends the episode the
 * metric shows (back to 0, said once), and a run of identical scrapes that now counts as frozen
 * starts one. Found with the scrape's time: the rule reads nothing else that time changes.
 */
function checkFrozen(
  deps: ObservationDeps,
  engine: EngineSlot,
  gauges: NonNullable<EngineSlot['gauges']>,
): void {
  if (engine.frozenSince !== undefined && engine.frozenSince !== gauges.unchangedSince) {
    const labels = { pool: deps.pool, engine: engine.name };
    engine.frozenSince = undefined;
    deps.metrics.engineGaugesFrozen.set(labels, 0);
    deps.log.info(
      { ...labels, running: gauges.running, waiting: gauges.waiting, kvUsage: gauges.kvUsage },
      'engine gauges moved again: normal gating',
    );
  }
  if (gaugesFrozen(engine, deps.policy, gauges.at)) reportFrozen(deps, engine);
}

/** What reporting a frozen-gauges episode needs. */
export interface FrozenReportDeps {
  pool: string;
  metrics: DispatcherMetrics;
  log: { warn(o: object, m: string): void };
}

/**
 * Says once per run of identical scrapes that `engine`'s gauges are frozen, and sets
 * `sluice_engine_gauges_frozen` to 1 until a scrape reads something else (`checkFrozen`). Called
 * where a scrape finds them frozen, and where the release loop lets the probe go: the in-flight
 * count the rule needs at 0 can reach 0 between two scrapes (a run ends), and a probe released
 * then may make the engine step before the next scrape, which would otherwise never see the
 * episode. The caller has checked `gaugesFrozen`.
 */
export function reportFrozen(deps: FrozenReportDeps, engine: EngineSlot): void {
  const gauges = engine.gauges;
  if (engine.frozenSince !== undefined || gauges === undefined) return;
  const labels = { pool: deps.pool, engine: engine.name };
  engine.frozenSince = gauges.unchangedSince ?? gauges.at;
  deps.metrics.engineGaugesFrozen.set(labels, 1);
  deps.log.warn(
    {
      ...labels,
      running: gauges.running,
      waiting: gauges.waiting,
      kvUsage: gauges.kvUsage,
      steps: gauges.steps,
      unchangedForMs: gauges.at - (gauges.unchangedSince ?? gauges.at),
    },
    'engine gauges frozen: they close the gate, Sluice has nothing in flight there and the engine has shown no progress (vLLM stops refreshing them when all its requests are aborted at once); the gate lets one probe request through to make it step',
  );
}

/**
 * An engine that exports its --max-num-seqs: a cap nobody set follows it. A cap someone set
 * is kept: below the engine's value it leaves room on purpose (other traffic, a reserve);
 * above it, requests past the engine's batch wait in vLLM's own queue, where Sluice cannot
 * order them, which is said once per value the engine shows.
 */
function checkMaxNumSeqs(
  deps: ObservationDeps,
  engine: EngineSlot,
  maxNumSeqs: number | undefined,
): void {
  if (maxNumSeqs === undefined || maxNumSeqs === engine.cap) return;
  const labels = { pool: deps.pool, engine: engine.name };
  if (engine.capFollowsEngine) {
    deps.log.warn(
      { ...labels, from: engine.cap, to: maxNumSeqs },
      "cap set from the engine's max_num_seqs",
    );
    engine.cap = maxNumSeqs;
    deps.metrics.inflightLimit.set(labels, engine.cap);
    deps.capChanged();
  } else if (maxNumSeqs < engine.cap && engine.reportedMaxNumSeqs !== maxNumSeqs) {
    engine.reportedMaxNumSeqs = maxNumSeqs;
    deps.log.error(
      { ...labels, cap: engine.cap, maxNumSeqs },
      "the cap set for this engine is above its max_num_seqs: requests past its batch wait in the engine's own queue, out of Sluice's order",
    );
  }
}
