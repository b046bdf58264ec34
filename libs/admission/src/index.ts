export {
  gateDecision,
  pickEngine,
  type EngineView,
  type GateDecision,
  type GateReason,
} from './gate.js';
export {
  retryAfterBounds,
  retryAfterSeconds,
  smoothRate,
  type RetryAfterInput,
} from './retry-after.js';
