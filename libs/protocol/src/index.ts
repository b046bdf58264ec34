export { isKeyPart, keyPartRule, keySpace, type KeySpace } from './keys.js';
export { ProtocolError } from './errors.js';
export {
  BULL_MAX_PRIORITY,
  bullPriority,
  completionPaths,
  jobBody,
  BODY_KEY_GRACE_MS,
  QUEUE_EVENTS_MAX_LEN,
  validateJobPayload,
  type CompletionPath,
  type JobPayload,
  type QueueLevel,
} from './job.js';
export {
  decodeCancel,
  decodeFrame,
  encodeCancel,
  encodeDataFrame,
  encodeBundle,
  encodeFrame,
  frameJobId,
  isTokenCount,
  messageFrames,
  type EndInfo,
  type ErrorInfo,
  type Frame,
  type FrameType,
  type HeadInfo,
  type StartInfo,
} from './frames.js';
export {
  decodePoolMode,
  decodePoolStats,
  encodePoolStats,
  isPoolMode,
  poolModes,
  type EngineStats,
  type LongPromptStats,
  type PoolMode,
  type PoolStats,
  type TenantStats,
} from './stats.js';
export {
  isRejectReason,
  refusal,
  refusalKinds,
  rejectReasons,
  type OpenAIErrorType,
  type Refusal,
  type RefusalKind,
  type RejectReason,
} from './reasons.js';
export { sluiceHeaders } from './headers.js';
