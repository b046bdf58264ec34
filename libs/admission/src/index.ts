export {
  bypassTraffic,
  freshGauges,
  gateDecision,
  headroom,
  pickEngine,
  type EngineGauges,
  type EngineHealth,
  type EngineView,
  type GateDecision,
  type GatePolicy,
  type GateReason,
} from './gate.js';
export {
  retryAfterBounds,
  retryAfterSeconds,
  smoothRate,
  type RetryAfterInput,
} from './retry-after.js';
export {
  initialLoadState,
  loadSignal,
  nextLoadState,
  type LoadInputs,
  type LoadProfile,
  type LoadSignalSource,
  type LoadState,
  type LoadStateOptions,
} from './load-state.js';
