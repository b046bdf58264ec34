// What the leading dispatcher publishes about a pool, for gateways (Retry-After) and `sluice status`.
import { ProtocolError } from './errors.js';

export interface PoolStats {
  /** Dispatcher id holding the lease. */
  leader: string;
  /** Unix ms of this snapshot. */
  at: number;
  /** Jobs released per second, smoothed. */
  drainPerSecond: number;
  engines: EngineStats[];
  /** The load state (degradation profile) jobs are released in now. */
  loadState?: string;
  /** Jobs in the queue by BullMQ state (`delayed`: long prompts the leader holds back). */
  queue?: { wait: number; prioritized: number; active: number; delayed?: number };
  /** Long prompts (prefill-aware admission), for the gateways' estimate of a long prompt's wait. */
  longs?: LongPromptStats;
  /** The operator's mode of the pool (absent: open). */
  mode?: PoolMode;
  /** Age in ms, at `at`, of the oldest queued (not yet released) job; 0 when none. */
  oldestQueuedMs?: number;
  /** Per configured tenant (absent without tenants), for `sluice status`. */
  tenants?: Record<string, TenantStats>;
}

/** `paused`: nothing is released, requests still queue; `draining`: no new requests, the queue is finished. */
export type PoolMode = 'open' | 'paused' | 'draining';

export const poolModes: readonly PoolMode[] = ['open', 'paused', 'draining'];

export function isPoolMode(value: unknown): value is PoolMode {
  return typeof value === 'string' && (poolModes as readonly string[]).includes(value);
}

/**
 * The mode stored under `keys.poolControl(pool)`: absent is open. `open` is never stored
 * (resume deletes the key); a value nobody wrote through `sluice pool` is a protocol error,
 * which readers treat as open, as the gateways' admission script does (it refuses only on
 * `draining`).
 */
export function decodePoolMode(stored: string | null): PoolMode {
  if (stored === null) return 'open';
  if (!isPoolMode(stored))
    throw new ProtocolError(
      `pool control value ${JSON.stringify(stored)} is not one of ${poolModes.join(', ')}`,
    );
  return stored;
}

export interface TenantStats {
  /** Queued (not yet released) in the pool, held ones included. */
  queued: number;
  /** Running on the pool's engines. */
  inflight: number;
  weight: number;
  /** Weighted service so far (the fair-share counter, in virtual tokens). */
  virtualTokens: number;
}

export interface LongPromptStats {
  /** Long prompts the leader holds back, and their estimated prompt tokens. */
  held: number;
  heldTokens: number;
  /** Long prompts in prefill on the engines, and the tokens of prefill they likely have left. */
  inPrefill: number;
  prefillRemainingTokens: number;
  /** Measured prefill rate of one long prompt, tokens per second; absent until measured. */
  prefillTokensPerSecond?: number;
  /** Long prompts the pool prefills at once. */
  parallelPrefills: number;
}

export interface EngineStats {
  name: string;
  inflight: number;
  cap: number;
  /** Whether the gate admits work on this engine, and why not. */
  open?: boolean;
  reason?: string;
  health?: 'unknown' | 'healthy' | 'stale';
  running?: number;
  waiting?: number;
  kvUsage?: number;
  /** Unix ms of the last successful scrape. */
  scrapedAt?: number;
}

export function encodePoolStats(stats: PoolStats): string {
  return JSON.stringify(stats);
}

export function decodePoolStats(text: string): PoolStats {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    throw new ProtocolError('pool stats are not JSON');
  }
  const s = value as Partial<PoolStats>;
  if (
    typeof s !== 'object' ||
    s === null ||
    typeof s.leader !== 'string' ||
    typeof s.at !== 'number' ||
    typeof s.drainPerSecond !== 'number' ||
    !Array.isArray(s.engines)
  )
    throw new ProtocolError('pool stats must have leader, at, drainPerSecond and engines');
  if (s.mode !== undefined && !isPoolMode(s.mode))
    throw new ProtocolError(
      `pool stats mode ${JSON.stringify(s.mode)} is not one of ${poolModes.join(', ')}`,
    );
  if (
    s.oldestQueuedMs !== undefined &&
    (typeof s.oldestQueuedMs !== 'number' ||
      !Number.isFinite(s.oldestQueuedMs) ||
      s.oldestQueuedMs < 0)
  )
    throw new ProtocolError(
      `pool stats oldestQueuedMs must be a number >= 0, got ${JSON.stringify(s.oldestQueuedMs)}`,
    );
  return s as PoolStats;
}
