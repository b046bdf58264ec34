// The gate: may the dispatcher release one more job to this engine now?
// Pure: everything it looks at comes in as arguments, time included (`now`).
//
// DESIGN's policy, admit only if all hold (`+ 1` is the job's engine requests: more with `n`
// > 1 or a batch of prompts):
//   1. in-flight + 1 <= cap                     -- never relaxes;
//   2. in-flight + 1 + bypass <= cap            -- engine gauge condition;
//   3. KV usage < kvThreshold                   -- engine gauge condition;
//   4. when the engine state is unknown or stale, the gauge conditions (2, 3) follow the
//      fail mode: skipped with 'open', the engine refused with 'closed'.
//
// Bypass traffic is what the engine runs or queues that this dispatcher did not send:
// running + waiting at the scrape, minus what the dispatcher had in flight at that same
// moment (so its own requests are not counted twice), floored at 0. It is combined with
// the CURRENT in-flight count, so the dispatcher's own releases and completions since the
// scrape are exact; only the bypass estimate lags, by up to one scrape interval (see the
// README for the direction of the error).
//
// Frozen gauges. vLLM v1 sets its gauges only from the scheduler stats of an engine step
// (`PrometheusStatLogger.record`, vllm/v1/metrics/loggers.py; `SchedulerStats`,
// vllm/v1/metrics/stats.py), and runs no step while its scheduler holds no request
// (`EngineCore.step` returns `{}` when `not self.scheduler.has_requests()`,
// vllm/v1/engine/core.py). When every request on an engine is aborted at once, the gauges
// keep their last values (vllm-project/vllm#22545, #29928): an empty engine that reads full.
// Sluice aborts requests itself (a client that leaves), and then conditions 2 and 3 would
// close the gate for good: nothing is released, so the engine never steps and the gauges
// never refresh. So where the gauges would close the gate while this dispatcher has nothing
// in flight on the engine, and neither they nor the engine's step counter changed over
// scrapes spanning `policy.frozenAfterMs`, they count as frozen and one engine request goes
// as a probe, whatever they say (condition 1 still holds). It makes the engine step, which
// refreshes the gauges; with it in flight the normal conditions apply again, so a probe never
// joins anything else of ours there. The threshold is what tells a frozen engine from one in
// a very long step (a long prefill chunk on slow hardware): an engine that outside traffic
// keeps full, and that takes one step longer than it, gets one request over its cap.

export type GateReason =
  /** The dispatcher's own in-flight count is at the cap. Never relaxes. */
  | 'inflight_cap'
  /** In-flight plus traffic that bypassed the broker is at the cap (fresh gauges). */
  | 'engine_busy'
  /** Fresh KV-cache usage is at or above the threshold. */
  | 'kv_pressure'
  /** Fail mode 'closed' and the engine state is unknown or stale. */
  | 'engine_stale';

/** One scrape of the engine's `/metrics`, as the observer read it. */
export interface EngineGauges {
  /** Requests the engine is running (`vllm:num_requests_running`). */
  running: number;
  /** Requests the engine has queued (`vllm:num_requests_waiting`). */
  waiting: number;
  /** KV-cache usage, 0..1. */
  kvUsage: number;
  /** Unix ms of the scrape. */
  at: number;
  /**
   * This dispatcher's in-flight count on the engine at the moment of that scrape, so the
   * broker's own requests are not counted twice.
   */
  inflightAtScrape: number;
  /**
   * The engine's step counter at the scrape (`vllm:iteration_tokens_total`'s count, which moves
   * on every step that sampled a token), when the engine exports it.
   */
  steps?: number;
  /**
   * Unix ms of the first scrape of the unbroken run of scrapes, ending with this one, that all
   * read the same running, waiting, KV usage and step counter (`unchangedSince` in frozen.ts).
   * `at - unchangedSince` is how long the engine is known to have shown no progress. Absent:
   * not tracked, and the gauges never count as frozen.
   */
  unchangedSince?: number;
}

export type EngineHealth = 'unknown' | 'healthy' | 'stale';

export interface EngineView {
  name: string;
  /**
   * Engine requests this dispatcher has in flight on the engine, counted exactly: one per job,
   * or its `sequences` (each of `n` choices, each prompt of a batch).
   */
  inflight: number;
  /** Hard cap per engine (ADMISSION_MAX_INFLIGHT). */
  cap: number;
  /** The last good scrape, if any. */
  gauges?: EngineGauges;
  /**
   * The observer's verdict. Absent with gauges present counts as healthy (the age of the
   * gauges still applies); 'unknown' or 'stale' make the state unusable whatever the gauges.
   */
  health?: EngineHealth;
}

export interface GatePolicy {
  /** ADMISSION_KV_THRESHOLD: the gate closes at or above this KV usage (0..1). */
  kvThreshold: number;
  /** ADMISSION_FAIL_MODE: what the gauge conditions do when the state is unknown/stale. */
  failMode: 'open' | 'closed';
  /** Gauges older than this count as stale even if the observer has not flipped yet. */
  maxGaugeAgeMs: number;
  /**
   * ADMISSION_FROZEN_GAUGES_SECONDS, in ms: fresh gauges that would close the gate count as
   * frozen once they and the step counter have not changed across scrapes spanning at least
   * this long (`at - unchangedSince`) while this dispatcher has nothing in flight on the
   * engine; one probe request is then admitted (`gaugesFrozen`). 0 or absent: never.
   */
  frozenAfterMs?: number;
}

export type GateDecision = { admit: true } | { admit: false; reason: GateReason };

const open: GateDecision = { admit: true };
const refuse = {
  inflight_cap: { admit: false, reason: 'inflight_cap' },
  engine_busy: { admit: false, reason: 'engine_busy' },
  kv_pressure: { admit: false, reason: 'kv_pressure' },
  engine_stale: { admit: false, reason: 'engine_stale' },
} as const satisfies Record<GateReason, GateDecision>;

/**
 * Traffic on the engine the broker did not send: running + waiting at the scrape minus
 * the broker's in-flight count at that scrape, floored at 0 (the engine may not have seen
 * a request the broker had just sent, or may already have finished one the broker has not
 * yet counted as complete).
 */
export function bypassTraffic(gauges: EngineGauges): number {
  return Math.max(0, gauges.running + gauges.waiting - gauges.inflightAtScrape);
}

function usableGauges(g: EngineGauges): boolean {
  return (
    Number.isFinite(g.running) &&
    Number.isFinite(g.waiting) &&
    Number.isFinite(g.kvUsage) &&
    Number.isFinite(g.at) &&
    Number.isFinite(g.inflightAtScrape)
  );
}

/**
 * The gauges of `engine` if its state is fresh: gauges present with finite values, the
 * observer's health neither 'unknown' nor 'stale', and the scrape no older than
 * `policy.maxGaugeAgeMs` at `now`. Undefined otherwise (the state is unknown or stale).
 */
export function freshGauges(
  engine: EngineView,
  policy: GatePolicy,
  now: number,
): EngineGauges | undefined {
  const g = engine.gauges;
  if (g === undefined || engine.health === 'unknown' || engine.health === 'stale') {
    return undefined;
  }
  if (!usableGauges(g)) return undefined;
  // NaN-safe: a non-finite `now` or threshold makes the comparison false, i.e. stale.
  if (!(now - g.at <= policy.maxGaugeAgeMs)) return undefined;
  return g;
}

// Implementations take `now` as given; the overloads below make a caller that passes a
// policy pass the time too. At run time a missing `now` reads as NaN, i.e. stale.
// `sequences`: how many engine requests the job becomes (vLLM V1 runs each of `n` choices and
// each prompt of a batch as a request of its own); all of them must fit under the cap.
function decide(
  engine: EngineView,
  policy: GatePolicy | undefined,
  now: number,
  sequences = 1,
): GateDecision {
  if (!(engine.inflight + sequences <= engine.cap)) return refuse.inflight_cap;
  if (policy === undefined) return open;
  const g = freshGauges(engine, policy, now);
  if (g === undefined) return policy.failMode === 'closed' ? refuse.engine_stale : open;
  const busy = !(engine.inflight + sequences + bypassTraffic(g) <= engine.cap);
  if (!busy && g.kvUsage < policy.kvThreshold) return open;
  // The probe: one engine request, and only with nothing of ours on the engine.
  if (sequences === 1 && frozen(engine, g, policy)) return open;
  return busy ? refuse.engine_busy : refuse.kv_pressure;
}

/**
 * The frozen-gauge rule on gauges `g` already known fresh: nothing of ours in flight, a
 * threshold set, the reading unchanged across scrapes spanning it, and gauges that would
 * close the gate to one engine request.
 */
function frozen(engine: EngineView, g: EngineGauges, policy: GatePolicy): boolean {
  const after = policy.frozenAfterMs;
  if (engine.inflight !== 0 || after === undefined || !(after > 0)) return false;
  const since = g.unchangedSince;
  if (since === undefined || !Number.isFinite(since) || !(g.at - since >= after)) return false;
  return !(1 + bypassTraffic(g) <= engine.cap) || !(g.kvUsage < policy.kvThreshold);
}

/**
 * Whether `engine`'s gauges count as frozen at `now` (see the top of this file): fresh, they
 * would close the gate to one engine request, this dispatcher has nothing in flight on the
 * engine, and they and the step counter have not changed across scrapes spanning at least
 * `policy.frozenAfterMs`. While it holds, `gateDecision` admits one engine request as a probe.
 */
export function gaugesFrozen(engine: EngineView, policy: GatePolicy, now: number): boolean {
  const g = freshGauges(engine, policy, now);
  return g !== undefined && frozen(engine, g, policy);
}

function room(engine: EngineView, policy: GatePolicy | undefined, now: number): number {
  const base = engine.cap - engine.inflight;
  if (policy === undefined) return base;
  const g = freshGauges(engine, policy, now);
  if (g === undefined) return base;
  // Frozen gauges leave the probe's slot (nothing of ours is in flight; none with a cap of 0).
  const r = base - bypassTraffic(g);
  return frozen(engine, g, policy) ? Math.max(r, Math.min(1, base)) : r;
}

/**
 * May the dispatcher release one more job to `engine` now, one of `sequences` engine requests
 * (default 1)? Without `policy` only the in-flight cap applies. Reasons are checked in this
 * order: inflight_cap, engine_stale, engine_busy, kv_pressure. A job of one engine request is
 * admitted past engine_busy and kv_pressure while the gauges count as frozen (`gaugesFrozen`):
 * the probe.
 */
export function gateDecision(engine: EngineView): GateDecision;
export function gateDecision(
  engine: EngineView,
  policy: GatePolicy | undefined,
  now: number,
  sequences?: number,
): GateDecision;
export function gateDecision(
  engine: EngineView,
  policy?: GatePolicy,
  now?: number,
  sequences?: number,
): GateDecision {
  return decide(engine, policy, now ?? Number.NaN, sequences);
}

/**
 * Slots left on `engine`: cap - inflight - bypass when its gauges are fresh, cap - inflight
 * otherwise (and always without `policy`). May be zero or negative; at least 1 (the probe's)
 * while the gauges count as frozen and the cap is not 0.
 */
export function headroom(engine: EngineView): number;
export function headroom(engine: EngineView, policy: GatePolicy | undefined, now: number): number;
export function headroom(engine: EngineView, policy?: GatePolicy, now?: number): number {
  return room(engine, policy, now ?? Number.NaN);
}

/**
 * The admissible engine with the most headroom; ties go to the earlier engine in
 * configuration order, so the choice is stable. -1 when none is admissible.
 */
export function pickEngine(engines: readonly EngineView[]): number;
export function pickEngine(
  engines: readonly EngineView[],
  policy: GatePolicy | undefined,
  now: number,
): number;
export function pickEngine(
  engines: readonly EngineView[],
  policy?: GatePolicy,
  now?: number,
): number {
  const t = now ?? Number.NaN;
  let best = -1;
  let bestRoom = 0;
  for (let i = 0; i < engines.length; i += 1) {
    const engine = engines[i]!;
    const r = room(engine, policy, t);
    if (best !== -1 && !(r > bestRoom)) continue;
    if (!decide(engine, policy, t).admit) continue;
    best = i;
    bestRoom = r;
  }
  return best;
}
