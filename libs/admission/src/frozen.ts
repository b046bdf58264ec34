// Frozen gauges: how long an engine's scrapes have read the same (see gate.ts, "Frozen
// gauges", for why and what the gate does with it). Pure: the scrapes and their times come in
// as arguments. The dispatcher calls `unchangedSince` once per new scrape, where it turns the
// scrape into the gate's `EngineGauges`.
//
// What counts as progress. vLLM v1 writes its gauges (`vllm:num_requests_running`,
// `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc`) from the scheduler stats every step
// returns, a step without request outputs included (`update_from_output`,
// vllm/v1/core/sched/scheduler.py: "We must return the stats even if there are no request
// outputs this step"), and observes `vllm:iteration_tokens_total` once per step that produced
// an output (`IterationStats() if (log_stats and num_outputs)`, vllm/v1/engine/async_llm.py;
// `record`, vllm/v1/metrics/loggers.py). A step that only advances chunked prefills moves no
// counter, but allocates the chunk's KV blocks, so the KV usage moves. An engine that steps
// therefore changes its gauges or its step counter from one step to the next; one that has
// stopped stepping changes neither. What is left is a single step that lasts longer than the
// threshold: it looks the same from outside.
import type { EngineGauges } from './gate.js';

/** What one scrape read of the engine, as far as progress goes. */
export type EngineReading = Pick<EngineGauges, 'running' | 'waiting' | 'kvUsage' | 'steps' | 'at'>;

/**
 * Whether two scrapes read the same: running, waiting, KV usage and step counter all equal
 * (a step counter absent from both counts as equal; one present in only one does not). A
 * non-finite number never equals anything, so it never reads as unchanged.
 */
export function sameReading(a: EngineReading, b: EngineReading): boolean {
  return (
    a.running === b.running &&
    a.waiting === b.waiting &&
    a.kvUsage === b.kvUsage &&
    a.steps === b.steps &&
    (a.steps === undefined || Number.isFinite(a.steps))
  );
}

/**
 * The `unchangedSince` of a new scrape `next`: the start of the run of identical scrapes it
 * continues (`previous.unchangedSince`, or `previous.at` when the previous scrape carries
 * none), or `next.at` when it reads differently from `previous`, when there is no previous
 * scrape, or when the two are out of order.
 */
export function unchangedSince(previous: EngineGauges | undefined, next: EngineReading): number {
  if (previous === undefined || !(next.at >= previous.at) || !sameReading(previous, next))
    return next.at;
  return previous.unchangedSince ?? previous.at;
}
