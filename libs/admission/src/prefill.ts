// Prefill-aware admission: which requests are long, how much of an engine they may hold,
// and when short requests may pass them. Pure: every input comes in as an argument, time
// included (`now`), so the dispatcher, the property tests and the docs share one rule book.
//
// Why (the reference incident): vLLM V1 runs running requests first and gives an unfinished
// prefill the rest of each step's token budget (vllm/v1/core/sched/scheduler.py); a 65k-token
// prompt holds that budget for minutes. `--long-prefill-token-threshold` caps one request's
// chunk per step, but nothing in vLLM stops four long prompts from taking all four slots, and
// a waiting head whose whole prompt does not fit in free KV blocks stops admission for every
// request behind it (`scheduler_reserve_full_isl`). The broker sees every request before the
// engine does, so it keeps the long ones to a share of the slots, one prefill at a time, and
// only where they fit, and lets short ones pass them for a bounded time.
import {
  freshGauges,
  gaugesFrozen,
  gateDecision,
  type EngineView,
  type GatePolicy,
  type GateReason,
} from './gate.js';

export interface LongPromptPolicy {
  /** A prompt estimated above this many tokens is long. */
  thresholdTokens: number;
  /** Share of an engine's slots long prompts may hold: floor(cap x share), at least one. */
  maxShare: number;
  /** Long prompts in prefill at once per engine (from release until their first byte). */
  maxInPrefill: number;
  /** A long prompt may be passed by short ones for at most this long (seconds since enqueue). */
  agingSeconds: number;
  /** Release a long prompt only where its estimate fits the engine's free KV tokens. */
  kvFit: boolean;
}

/** Which requests an engine takes: `long` engines only long prompts, `short` only short ones. */
export type Lane = 'any' | 'long' | 'short';

export type PromptClass = 'short' | 'long';

/** An engine as the prefill rules see it: the gate's view plus what long prompts hold there. */
export interface PrefillView extends EngineView {
  lane: Lane;
  /** Long prompts this dispatcher has in flight on the engine. */
  longInflight: number;
  /** Of those, the ones still in prefill (no first byte yet). */
  longInPrefill: number;
  /**
   * KV-cache size in tokens (`num_gpu_blocks` x `block_size`) that one request can count on,
   * when the engine exports it: with data-parallel ranks, the smallest rank's, since a request
   * runs on one rank and Sluice does not choose which.
   */
  kvCapacityTokens?: number;
  /**
   * KV the gauges cannot show yet, in estimated prompt tokens: requests released to the engine
   * since its last scrape, and the whole prompt of long ones still in prefill (vLLM allocates a
   * prompt's blocks chunk by chunk, so the usage gauge shows only part of it; counting the whole
   * prompt errs toward holding).
   */
  kvPendingTokens: number;
}

/** Why a long prompt is held although the plain gate would admit it. */
export type HoldReason =
  /** The engine already runs its share of long prompts. */
  | 'long_share'
  /** The engine already prefills `maxInPrefill` long prompts. */
  | 'long_prefill'
  /** The estimate does not fit the engine's free KV tokens. */
  | 'kv_fit'
  /** The engine takes no requests of this class (`lane`). */
  | 'lane';

export type ReleaseDecision = { admit: true } | { admit: false; reason: GateReason | HoldReason };

export type EnginePick =
  { admit: true; index: number } | { admit: false; reason: GateReason | HoldReason };

const admit: ReleaseDecision = { admit: true };
const hold = (reason: GateReason | HoldReason): ReleaseDecision => ({ admit: false, reason });

export function classify(promptTokens: number, policy: LongPromptPolicy): PromptClass {
  return promptTokens > policy.thresholdTokens ? 'long' : 'short';
}

/** Slots of `engine` long prompts may hold: all of a `long` lane, else floor(cap x share) >= 1. */
export function longSlots(engine: PrefillView, policy: LongPromptPolicy): number {
  if (engine.lane === 'long') return engine.cap;
  return Math.max(1, Math.floor(engine.cap * policy.maxShare));
}

/**
 * Free KV tokens on `engine` as of its last fresh scrape, less what was released since; undefined
 * when the capacity or fresh gauges are unknown (the KV rule then follows the fail mode). With
 * data-parallel ranks it is a floor for the fullest one: the smallest rank's capacity at the
 * fullest rank's usage, so a prompt that fits here fits whichever rank vLLM puts it on.
 */
export function freeKvTokens(
  engine: PrefillView,
  gate: GatePolicy,
  now: number,
): number | undefined {
  if (engine.kvCapacityTokens === undefined) return undefined;
  const g = freshGauges(engine, gate, now);
  if (g === undefined) return undefined;
  // Frozen gauges (gate.ts) show what ran before every request was aborted, not what is left:
  // the probe they allow may be a long prompt, which the frozen KV usage would hold for good.
  const used = gaugesFrozen(engine, gate, now) ? 0 : g.kvUsage;
  return engine.kvCapacityTokens * (1 - used) - engine.kvPendingTokens;
}

/**
 * May a request of `promptTokens`, run as `sequences` engine requests (default 1), go to
 * `engine` now? For a long prompt the rules that only
 * long prompts are subject to come first (its lane, its share of slots, prefills at once),
 * then the plain gate, then KV fit; for a short one its lane, then the plain gate. So a
 * reason says what would still hold the prompt if short ones left room: `long_share` and
 * `long_prefill` hold it whatever short prompts do, a gate reason or `kv_fit` only because the
 * room is taken. With unknown KV (no capacity exported, stale gauges) the KV rule holds a
 * long prompt only in fail mode `closed`; a prompt larger than the whole KV cache is not held
 * by it at all.
 */
export function releaseDecision(
  engine: PrefillView,
  promptClass: PromptClass,
  promptTokens: number,
  policy: LongPromptPolicy,
  gate: GatePolicy,
  now: number,
  sequences = 1,
): ReleaseDecision {
  if (promptClass === 'short') {
    if (engine.lane === 'long') return hold('lane');
    return gateDecision(engine, gate, now, sequences);
  }
  if (engine.lane === 'short') return hold('lane');
  if (!(engine.longInflight < longSlots(engine, policy))) return hold('long_share');
  if (!(engine.longInPrefill < policy.maxInPrefill)) return hold('long_prefill');
  const base = gateDecision(engine, gate, now, sequences);
  if (!base.admit) return base;
  // A prompt larger than the whole KV cache never fits: held, it would wait to its park limit,
  // and once aged it would hold every short prompt behind it. vLLM refuses to start an engine
  // whose max_model_len does not fit its KV cache (check_enough_kv_cache_memory,
  // vllm/v1/core/kv_cache_utils.py), so such a prompt is over max_model_len if the estimate is
  // right, and vLLM answers it with a 400 at once; if the estimate is high, it runs.
  if (policy.kvFit && !(promptTokens > (engine.kvCapacityTokens ?? Infinity))) {
    const free = freeKvTokens(engine, gate, now);
    if (free === undefined ? gate.failMode === 'closed' : !(promptTokens <= free))
      return hold('kv_fit');
  }
  return admit;
}

// The order in which a refusal is reported for a whole pool: the reason of the engine that
// came closest to taking the request. Closest is an engine where only room holds it (room
// that short prompts could take), then one where a long-prompt rule holds it, and `lane`
// (never possible there) last.
const closeness: readonly (GateReason | HoldReason)[] = [
  'kv_fit',
  'inflight_cap',
  'engine_busy',
  'kv_pressure',
  'engine_stale',
  'long_prefill',
  'long_share',
  'lane',
];

/**
 * The engine for a request, or why none takes it. Short requests go where the most slots are
 * free; long ones where the fewest long prompts run, then the most KV is free, then the most
 * slots are free. Ties go to the earlier engine in configuration order.
 */
export function pickEngineFor(
  engines: readonly PrefillView[],
  promptClass: PromptClass,
  promptTokens: number,
  policy: LongPromptPolicy,
  gate: GatePolicy,
  now: number,
  sequences = 1,
): EnginePick {
  let best = -1;
  let bestKey: number[] = [];
  let reason: GateReason | HoldReason = 'lane';
  for (let i = 0; i < engines.length; i += 1) {
    const engine = engines[i]!;
    const decision = releaseDecision(
      engine,
      promptClass,
      promptTokens,
      policy,
      gate,
      now,
      sequences,
    );
    if (!decision.admit) {
      if (closeness.indexOf(decision.reason) < closeness.indexOf(reason)) reason = decision.reason;
      continue;
    }
    const room = engine.cap - engine.inflight;
    const key =
      promptClass === 'short'
        ? [room]
        : [-engine.longInflight, freeKvTokens(engine, gate, now) ?? 0, room];
    if (best === -1 || greater(key, bestKey)) {
      best = i;
      bestKey = key;
    }
  }
  return best === -1 ? { admit: false, reason } : { admit: true, index: best };
}

function greater(a: readonly number[], b: readonly number[]): boolean {
  for (let i = 0; i < a.length; i += 1) if (a[i] !== b[i]) return a[i]! > b[i]!;
  return false;
}

/** Whether a long prompt enqueued at `enqueuedAt` may no longer be passed by short ones. */
export function isAged(enqueuedAt: number, policy: LongPromptPolicy, now: number): boolean {
  return now - enqueuedAt >= policy.agingSeconds * 1000;
}

/**
 * May short requests be released while the oldest held long prompt waits for `reason`?
 * Before its aging limit, always. After it, only while what holds it is a rule that short
 * requests do not touch (its share of slots, one prefill at a time, its lane): they take
 * nothing it could use. When slots, KV or engine load hold it, short requests wait so that
 * the next room goes to it.
 */
export function shortsMayPass(aged: boolean, reason: GateReason | HoldReason): boolean {
  return !aged || reason === 'long_share' || reason === 'long_prefill' || reason === 'lane';
}

export interface LongWaitInput {
  /** Estimated prompt tokens of the long prompts ahead (held, and the rest of those in prefill). */
  tokensAhead: number;
  /** Measured long-prompt prefill rate of one engine, tokens per second; undefined until measured. */
  prefillTokensPerSecond: number | undefined;
  /** Long prompts the pool prefills at once (engines that take them x maxInPrefill). */
  parallelPrefills: number;
}

/**
 * Seconds until a new long prompt would start its prefill, from the long prompts ahead and the
 * measured rate; undefined while no rate is measured (the gateway then parks it as usual).
 */
export function longWaitSeconds({
  tokensAhead,
  prefillTokensPerSecond,
  parallelPrefills,
}: LongWaitInput): number | undefined {
  if (prefillTokensPerSecond === undefined || !(prefillTokensPerSecond > 0)) return undefined;
  if (!(parallelPrefills > 0)) return undefined;
  return Math.max(0, tokensAhead) / (prefillTokensPerSecond * parallelPrefills);
}
