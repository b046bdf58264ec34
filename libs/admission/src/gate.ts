// The gate: may the dispatcher release one more job to this engine now?
// Pure: everything it looks at comes in as arguments. The engine-gauge conditions of
// DESIGN's policy (traffic that bypassed the broker, KV usage, fail mode) extend
// `EngineView` and `gateDecision` in the observer issue; the in-flight cap never relaxes.

export type GateReason = 'inflight_cap';

export interface EngineView {
  name: string;
  /** Requests this dispatcher has in flight on the engine, counted exactly. */
  inflight: number;
  /** Hard cap per engine (ADMISSION_MAX_INFLIGHT). */
  cap: number;
}

export type GateDecision = { admit: true } | { admit: false; reason: GateReason };

const open: GateDecision = { admit: true };
const atCap: GateDecision = { admit: false, reason: 'inflight_cap' };

export function gateDecision(engine: EngineView): GateDecision {
  return engine.inflight < engine.cap ? open : atCap;
}

/**
 * The admissible engine with the most headroom (cap - inflight); ties go to the earlier
 * engine in configuration order, so the choice is stable. -1 when none is admissible.
 */
export function pickEngine(engines: readonly EngineView[]): number {
  let best = -1;
  let bestHeadroom = 0;
  for (let i = 0; i < engines.length; i += 1) {
    const engine = engines[i]!;
    if (!gateDecision(engine).admit) continue;
    const headroom = engine.cap - engine.inflight;
    if (best === -1 || headroom > bestHeadroom) {
      best = i;
      bestHeadroom = headroom;
    }
  }
  return best;
}
