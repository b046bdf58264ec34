// Jobs the leader took from the queue but may not release yet (a long prompt over its share,
// behind another's prefill, or too big for the free KV): held back so that the jobs behind
// them can pass, without leaving the queue's bookkeeping.
//
// BullMQ hands out jobs only in its own order (priority, then FIFO), so a job that must wait
// while others pass is moved to the queue's delayed set (`moveToDelayed`), scheduled a little
// past its deadline. There it is no longer active (the global-concurrency backstop counts only work
// on the engines), the gateways still count it against the queue bound and can still remove
// it when its client goes, and should this leader die, its successor finds it there
// (`adopt`), or BullMQ itself moves it back to the queue after its deadline, where the next
// leader expires it. When one may go, it is promoted back into the queue
// (after the short prompts of its class, or before them once aged) and the release loop,
// woken by the promotion, takes it like any other job.
import { comesBefore, type QueuedPrompt } from '@sluice/admission';
import type { Job } from 'bullmq';

export interface HeldJob extends QueuedPrompt {
  id: string;
  job: Job;
}

export class HeldJobs {
  private readonly list: HeldJob[] = [];
  /** The job promoted back into the queue and not yet taken again. */
  promoted: string | undefined;

  get size(): number {
    return this.list.length;
  }

  /** Held jobs in release order (`comesBefore`). */
  ordered(): readonly HeldJob[] {
    return this.list;
  }

  has(id: string): boolean {
    return this.list.some((h) => h.id === id);
  }

  add(held: HeldJob): void {
    if (this.has(held.id)) return;
    let i = this.list.length;
    while (i > 0 && comesBefore(held, this.list[i - 1]!)) i -= 1;
    this.list.splice(i, 0, held);
  }

  remove(id: string): HeldJob | undefined {
    const i = this.list.findIndex((h) => h.id === id);
    if (i === -1) return undefined;
    if (this.promoted === id) this.promoted = undefined;
    return this.list.splice(i, 1)[0];
  }

  /** Estimated prompt tokens of the held long prompts. */
  longTokens(): { count: number; tokens: number } {
    let count = 0;
    let tokens = 0;
    for (const h of this.list)
      if (h.long) {
        count += 1;
        tokens += h.promptTokens;
      }
    return { count, tokens };
  }

  clear(): void {
    this.list.length = 0;
    this.promoted = undefined;
  }
}
