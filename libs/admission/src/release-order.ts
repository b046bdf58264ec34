// Choosing: may this job go now, to which engine, and which held job goes next. The rules are
// `@sluice/admission`'s prefill rules; this module adds the order among jobs (held-jobs.ts
// keeps them). No I/O: pool-dispatcher.ts does the moving.
//
// One predicate, `decide`, answers both questions (for a job just taken and for each held
// one), so a job promoted because it may go is released when it comes back, never held
// again for a reason the promotion did not see.
import {
  classify,
  isAged,
  pickEngineFor,
  shortsMayPass,
  type GatePolicy,
  type LongPromptPolicy,
  type PrefillView,
} from '@sluice/admission';
import { comesBefore, type HeldJob, type HeldJobs } from './held-jobs.js';

/** A job as the order sees it. */
export type Candidate = Omit<HeldJob, 'job'>;

/**
 * Why a job waits: a rule of `@sluice/admission` (`long_share`, `long_prefill`, `kv_fit`,
 * `lane`), a closed plain gate (`gate`), an older long prompt held ahead of it (`long_ahead`),
 * or an aged long prompt that short ones may no longer pass (`aged_long`). The `reason`
 * label of `sluice_release_held_total`.
 */
export type WaitReason =
  'long_share' | 'long_prefill' | 'kv_fit' | 'lane' | 'gate' | 'long_ahead' | 'aged_long';

export type Verdict = { go: true; engine: number } | { go: false; reason: WaitReason };

export class ReleaseOrder {
  constructor(
    private readonly engines: readonly PrefillView[],
    private readonly held: HeldJobs,
    private readonly policy: LongPromptPolicy,
    private readonly gate: GatePolicy,
  ) {}

  isLong(promptTokens: number): boolean {
    return classify(promptTokens, this.policy) === 'long';
  }

  /** May `job` go now, and where. */
  decide(job: Candidate, now: number): Verdict {
    const pick = pickEngineFor(
      this.engines,
      job.long ? 'long' : 'short',
      job.promptTokens,
      this.policy,
      this.gate,
      now,
    );
    if (!pick.admit) {
      const r = pick.reason;
      const reason =
        r === 'long_share' || r === 'long_prefill' || r === 'kv_fit' || r === 'lane' ? r : 'gate';
      return { go: false, reason };
    }
    // Long prompts keep their order among themselves (a smaller one that would fit does not
    // jump a bigger one waiting for KV, or the big one could wait forever).
    if (job.long && this.held.ordered().some((h) => h.long && comesBefore(h, job)))
      return { go: false, reason: 'long_ahead' };
    if (!job.long && this.shortsHeld(job.priority, now)) return { go: false, reason: 'aged_long' };
    return { go: true, engine: pick.index };
  }

  /** The first held job that may go now, if any. */
  nextToPromote(now: number): HeldJob | undefined {
    for (const h of this.held.ordered()) if (this.decide(h, now).go) return h;
    return undefined;
  }

  /** Whether `h`, a held long prompt, goes back ahead of the short prompts of its class. */
  isAged(h: Candidate, now: number): boolean {
    return h.long && isAged(h.enqueuedAt, this.policy, now);
  }

  /**
   * Whether short prompts of class `priority` must wait for the oldest held long prompt of the
   * same or a higher class: it is past its aging limit and held by something short prompts
   * would take from it (slots, KV, engine load).
   */
  private shortsHeld(priority: number, now: number): boolean {
    const first = this.held.ordered().find((h) => h.long && h.priority >= priority);
    if (first === undefined || !isAged(first.enqueuedAt, this.policy, now)) return false;
    const pick = pickEngineFor(
      this.engines,
      'long',
      first.promptTokens,
      this.policy,
      this.gate,
      now,
    );
    return !pick.admit && !shortsMayPass(true, pick.reason);
  }
}
