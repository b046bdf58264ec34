export {
  bypassTraffic,
  freshGauges,
  gateDecision,
  gaugesFrozen,
  headroom,
  pickEngine,
  type EngineGauges,
  type EngineHealth,
  type EngineView,
  type GateDecision,
  type GatePolicy,
  type GateReason,
} from './gate.js';
export { sameReading, unchangedSince, type EngineReading } from './frozen.js';
export {
  retryAfterBounds,
  retryAfterSeconds,
  smoothRate,
  type DrainWindow,
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
export {
  classify,
  freeKvTokens,
  isAged,
  longSlots,
  longWaitSeconds,
  pickEngineFor,
  releaseDecision,
  shortsMayPass,
  type EnginePick,
  type HoldReason,
  type Lane,
  type LongPromptPolicy,
  type LongWaitInput,
  type PrefillView,
  type PromptClass,
  type ReleaseDecision,
} from './prefill.js';
export {
  comesBefore,
  nextToPromote,
  releaseVerdict,
  shortsHeld,
  waitReasons,
  withHeld,
  type OrderContext,
  type QueuedPrompt,
  type Verdict,
  type WaitReason,
} from './release-order.js';
export {
  fairShareBound,
  VirtualTokenCounter,
  type FairShareOptions,
  type FairShareState,
} from './fair-share.js';
