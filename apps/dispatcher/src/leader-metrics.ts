// One exporter per fact: a pool's gauges (its queue, the engines as read, its gate and load
// state) are exported by the pool's leader only. Every dispatcher keeps reading them (a
// standby scrapes the engines so that it gates at once when it takes over), but a standby's
// view is not the pool's: it sends nothing, so it takes every request on the engine for
// bypass traffic, and a sum over dispatchers would count the queue once per dispatcher.
//
// The filter is applied where the series are collected, not where they are written: a
// series is left out of /metrics while this process does not lead its pool, from the moment
// the lease is lost or the pool closes (Lease.stop drops the leadership first). Removing
// series on loss instead would lose gauges written only on change (the gate, the held long
// prompts) until their next change after the lease came back.
//
// Per-dispatcher series stay with every dispatcher: sluice_leader (0 or 1: what
// SluiceNoLeader reads), in-flight counts (a standby's are 0, a sum over dispatchers is
// right), and counters (summed as rates; sluice_gate_closed_total counts in the release loop,
// which runs only while leading; sluice_engine_state_stale_total counts each dispatcher's own
// observation, and the rules read sluice_engine_up instead).
import type { DispatcherMetrics } from '@sluice/observability';

/** The pool-level gauges, each labelled with `pool`. */
export const LEADER_ONLY_METRICS = [
  'queueDepth',
  'queueOldestAge',
  'poolMode',
  'engineRunning',
  'engineWaiting',
  'engineKvUsage',
  'engineBypass',
  'engineGaugesFrozen',
  'engineUp',
  'engineLastScrape',
  'observerDegraded',
  'inflightLimit',
  'gateOpen',
  'loadState',
  'loadSignal',
  'longHeld',
  'prefillRate',
  'tenantQueued',
  'tenantVirtualTokens',
] as const satisfies readonly (keyof DispatcherMetrics)[];

/**
 * The gauges labelled with `pool` that every dispatcher exports: its leadership (0 or 1, what
 * SluiceNoLeader reads) and what it runs itself (a standby's are 0; a sum is right).
 */
export const PER_DISPATCHER_GAUGES = [
  'leader',
  'inflight',
  'longInflight',
  'longInPrefill',
  'tenantInflight',
] as const satisfies readonly (keyof DispatcherMetrics)[];

/**
 * Makes the leader-only gauges of `metrics` export only the series of pools for which
 * `leads(pool)` holds at collection time. Call once, right after creating the metrics.
 */
export function exportLedPoolsOnly(
  metrics: DispatcherMetrics,
  leads: (pool: string) => boolean,
): void {
  for (const key of LEADER_ONLY_METRICS) {
    const gauge = metrics[key];
    const collect = gauge.get.bind(gauge);
    gauge.get = async () => {
      const all = await collect();
      return { ...all, values: all.values.filter((v) => leads(String(v.labels['pool']))) };
    };
  }
}
