// The reference incident replayed on the pure scheduler (homelab profile): 2 x 65,536 and
// 15 x 8,192-token prompts at t = 0, and a short chat request (200 prompt tokens, 64 out)
// every 2 s for 10 minutes. Prints the timelines the README quotes.
import { describe, expect, it } from 'vitest';
import { profiles } from '../src/profiles.ts';
import { Scheduler, Sequence, type SequenceListener } from '../src/scheduler.ts';

const quiet: SequenceListener = { onToken: () => {}, onFinish: () => {} };

function replay(longPrefillTokenThreshold: number) {
  const s = new Scheduler({ ...profiles.homelab, longPrefillTokenThreshold });
  const longs: Sequence[] = [];
  for (let i = 0; i < 2; i += 1) longs.push(new Sequence(`L${i}`, 65536, 256, 'length', 0, quiet));
  for (let i = 0; i < 15; i += 1) longs.push(new Sequence(`M${i}`, 8192, 256, 'length', 0, quiet));
  const shorts = Array.from(
    { length: 300 },
    (_, i) => new Sequence(`S${i}`, 200, 64, 'length', 2 * (i + 1), quiet),
  );
  const pending = [...longs, ...shorts];
  let t = 0;
  for (let n = 0; n < 10_000_000; n += 1) {
    while (pending.length > 0 && pending[0]!.arrival <= t) s.add(pending.shift()!);
    let start = s.nextStart(t);
    if (start === undefined) {
      if (pending.length === 0) break;
      start = pending[0]!.arrival;
      s.add(pending.shift()!);
    }
    const step = s.schedule(start);
    if (!step) {
      t = pending[0]?.arrival ?? t;
      continue;
    }
    s.complete(step);
    t = step.start + step.duration;
  }
  const ttft = shorts.map((q) => q.firstTokenAt! - q.arrival).sort((a, b) => a - b);
  const pct = (p: number) => ttft[Math.min(ttft.length - 1, Math.floor(p * ttft.length))]!;
  return {
    p50: pct(0.5),
    p90: pct(0.9),
    max: ttft.at(-1)!,
    longDone: longs.filter((q) => q.promptTokens === 65536).map((q) => q.finishedAt!),
    mediumDone: Math.max(...longs.filter((q) => q.promptTokens === 8192).map((q) => q.finishedAt!)),
    preemptions: s.preemptions,
  };
}

describe('reference incident on the homelab profile', () => {
  it('short requests wait for a batch slot behind all 17 long prompts (FCFS, max_num_seqs 4), with or without --long-prefill-token-threshold 512', () => {
    const base = replay(0);
    const capped = replay(512);
    const fmt = (r: ReturnType<typeof replay>) =>
      `TTFT p50 ${r.p50.toFixed(1)} s, p90 ${r.p90.toFixed(1)} s, max ${r.max.toFixed(1)} s; ` +
      `65k prompts done at ${r.longDone.map((x) => x.toFixed(0)).join(' / ')} s; ` +
      `last 8k prompt done at ${r.mediumDone.toFixed(0)} s; preemptions ${r.preemptions}`;
    console.log(`default: ${fmt(base)}\nthreshold 512: ${fmt(capped)}`);
    expect(base.p50).toBeGreaterThan(600);
    // The cap reshapes the step budget among running requests only; the short ones are
    // still behind every long prompt in the waiting queue.
    expect(Math.abs(capped.p50 - base.p50)).toBeLessThan(10);
    expect(Math.max(...capped.longDone)).toBeGreaterThan(Math.max(...base.longDone));
    expect(base.preemptions).toBe(0); // full-prompt admission: none (reference: 0)
  });
});
