export { peekRequest } from './peek.js';
export { RequestPeekError } from './errors.js';
export type { RequestPeekErrorCode } from './errors.js';
export { MAX_DEPTH } from './scan.js';
export { openaiErrorBody } from './error-body.js';
export { SSE_DONE, SSE_KEEPALIVE, sseData, sseError } from './sse.js';
export type { ByteSpan, PeekedRequest } from './types.js';
export { plannedMaxTokens, rewriteRequest } from './rewrite.js';
export type { RewritePlan } from './rewrite.js';
