// The order of release among queued prompts: may this one go now, to which engine, and which
// held one goes next. The per-engine rules are `prefill.ts`; this adds the order among
// prompts: a higher class first; within a class, short before long, long ones first come,
// first served; an aged long prompt ahead of the short ones it would otherwise lose room to.
// Pure: the held prompts, the engines and the time come in as arguments.
//
// One predicate, `releaseVerdict`, answers both questions (for a prompt just taken and for
// each held one), so a prompt promoted because it may go is released when it comes back,
// never held again for a reason the promotion did not see.
import { headroom, type GatePolicy } from './gate.js';
import {
  isAged,
  pickEngineFor,
  shortsMayPass,
  type LongPromptPolicy,
  type PrefillView,
} from './prefill.js';

/** A prompt waiting to be released, as the order sees it. */
export interface QueuedPrompt {
  long: boolean;
  promptTokens: number;
  /** Sluice priority class: higher goes first. */
  priority: number;
  /** Unix ms the gateway enqueued it. */
  enqueuedAt: number;
  /**
   * Engine requests it becomes (`n` choices x prompts of a batch; absent: 1). A wide prompt
   * goes only where all of them fit under the cap, so once aged it keeps the room it waits for
   * from the prompts behind it, as an aged long prompt does.
   */
  sequences?: number;
}

/** Release order among held prompts: higher class first, then short before long, then FIFO. */
export function comesBefore(a: QueuedPrompt, b: QueuedPrompt): boolean {
  if (a.priority !== b.priority) return a.priority > b.priority;
  if (a.long !== b.long) return !a.long;
  return a.enqueuedAt < b.enqueuedAt;
}

/**
 * Why a prompt waits: a rule of `prefill.ts` (`long_share`, `long_prefill`, `kv_fit`, `lane`),
 * a closed plain gate (`gate`; for a wide prompt also too few free slots for all its
 * sequences), an older long prompt held ahead of it (`long_ahead`), an aged long prompt that
 * short ones may no longer pass (`aged_long`), or an aged wide prompt ahead of it waiting for
 * room (`aged_wide`). The `reason` label of `sluice_release_held_total`.
 */
export type WaitReason =
  | 'long_share'
  | 'long_prefill'
  | 'kv_fit'
  | 'lane'
  | 'gate'
  | 'long_ahead'
  | 'aged_long'
  | 'aged_wide';

export const waitReasons: readonly WaitReason[] = [
  'long_share',
  'long_prefill',
  'kv_fit',
  'lane',
  'gate',
  'long_ahead',
  'aged_long',
  'aged_wide',
];

export type Verdict = { go: true; engine: number } | { go: false; reason: WaitReason };

export interface OrderContext {
  engines: readonly PrefillView[];
  /** Prompts held back, in release order (`comesBefore`). */
  held: readonly QueuedPrompt[];
  policy: LongPromptPolicy;
  gate: GatePolicy;
  now: number;
}

/** May `prompt` go now, and to which engine. */
export function releaseVerdict(prompt: QueuedPrompt, ctx: OrderContext): Verdict {
  const { engines, held, policy, gate, now } = ctx;
  const pick = pickEngineFor(
    engines,
    prompt.long ? 'long' : 'short',
    prompt.promptTokens,
    policy,
    gate,
    now,
    prompt.sequences,
  );
  if (!pick.admit) {
    const r = pick.reason;
    const reason =
      r === 'long_share' || r === 'long_prefill' || r === 'kv_fit' || r === 'lane' ? r : 'gate';
    return { go: false, reason };
  }
  // Long prompts keep their order among themselves: a smaller one that would fit does not
  // jump a bigger one waiting for KV, or the big one could wait forever.
  if (prompt.long && held.some((h) => h.long && comesBefore(h, prompt)))
    return { go: false, reason: 'long_ahead' };
  if (!prompt.long && shortsHeld(prompt.priority, ctx)) return { go: false, reason: 'aged_long' };
  // An aged long prompt goes first: it and an aged wide one never wait for each other.
  if (!(prompt.long && isAged(prompt.enqueuedAt, policy, now)) && wideHeldAhead(prompt, ctx))
    return { go: false, reason: 'aged_wide' };
  return { go: true, engine: pick.index };
}

/**
 * The first held prompt, in release order, that may go now, if any. An aged long prompt that
 * may go is never behind a short one that may: `shortsHeld` holds those.
 */
export function nextToPromote<T extends QueuedPrompt>(
  held: readonly T[],
  ctx: Omit<OrderContext, 'held'>,
): T | undefined {
  const full = withHeld(ctx, held);
  for (const h of held) if (releaseVerdict(h, full).go) return h;
  return undefined;
}

/**
 * `ctx` with `held`, field by field. Not `{ ...ctx, held }`: on Node 20 a property added after
 * a leading spread makes a new hidden class on every evaluation, and this runs for every
 * released job (docs/performance.md, "A property after a spread").
 */
export function withHeld(
  ctx: Omit<OrderContext, 'held'>,
  held: readonly QueuedPrompt[],
): OrderContext {
  return { engines: ctx.engines, held, policy: ctx.policy, gate: ctx.gate, now: ctx.now };
}

/**
 * Whether short prompts of class `priority` must wait for the oldest held long prompt of the
 * same or a higher class: it is past its aging limit, and either it may go now or what holds
 * it is room that short prompts would take (slots, KV, engine load), not a rule of its own.
 */
export function shortsHeld(priority: number, ctx: OrderContext): boolean {
  const { engines, held, policy, gate, now } = ctx;
  const first = held.find((h) => h.long && h.priority >= priority);
  if (first === undefined || !isAged(first.enqueuedAt, policy, now)) return false;
  const pick = pickEngineFor(engines, 'long', first.promptTokens, policy, gate, now);
  return pick.admit || !shortsMayPass(true, pick.reason);
}

/**
 * Whether `prompt` (short, or long and not aged) must wait for a wide prompt held ahead of it
 * in release order: the first such one (several sequences, same or higher class) is past its
 * aging limit, would fit some engine once this dispatcher's own requests there ended, and
 * either may go now or waits only for room that `prompt` would take. Without this a prompt of
 * `n` = 8 under steady traffic would wait for eight free slots at once, which every freed slot
 * taken at once by the next request never leaves; newer long prompts wait too, or a steady
 * stream of them would keep their share of the slots for ever. An aged long prompt does not
 * wait for it, and it waits for an aged long prompt, so the two never wait for each other.
 * Where traffic that bypassed Sluice leaves too little room even with nothing of Sluice's
 * running, holding the others would not make room: nobody waits for it.
 */
function wideHeldAhead(prompt: QueuedPrompt, ctx: OrderContext): boolean {
  const { engines, held, policy, gate, now } = ctx;
  const first = held.find((h) => h !== prompt && (h.sequences ?? 1) > 1 && comesBefore(h, prompt));
  if (first === undefined || !isAged(first.enqueuedAt, policy, now)) return false;
  const sequences = first.sequences ?? 1;
  const lane = first.long ? 'short' : 'long';
  const couldFit = (e: PrefillView) =>
    e.lane !== lane && sequences <= headroom({ ...e, inflight: 0 }, gate, now);
  if (!engines.some(couldFit)) return false;
  // A short wide prompt that itself waits for an aged long one holds nobody: the long one
  // goes first (two prompts each waiting for the other would wait forever).
  if (!first.long && shortsHeld(first.priority, ctx)) return false;
  const pick = pickEngineFor(
    engines,
    first.long ? 'long' : 'short',
    first.promptTokens,
    policy,
    gate,
    now,
    sequences,
  );
  return pick.admit || !shortsMayPass(true, pick.reason);
}
