import { openaiErrorBody } from './error-body.js';

/** An SSE comment: keeps a waiting stream (and every proxy on the way) from timing out. */
export const SSE_KEEPALIVE = ': keep-alive\n\n';

/** The event that ends an OpenAI stream. */
export const SSE_DONE = 'data: [DONE]\n\n';

/**
 * One SSE event carrying `json`. JSON.stringify output has no line breaks and takes the fast
 * path; a payload with line breaks gets one `data:` line per line, which SSE joins back with
 * '\n' (JSON whitespace), so no break can end the event early.
 */
export function sseData(json: string): string {
  if (json.indexOf('\n') < 0 && json.indexOf('\r') < 0) return `data: ${json}\n\n`;
  return `data: ${json.split(/\r\n|\r|\n/).join('\ndata: ')}\n\n`;
}

/**
 * An in-band error event, for a stream whose headers are already sent: OpenAI SDKs raise it.
 * End a failed stream with `sseErrorEnd`, not with this alone.
 */
export function sseError(
  message: string,
  type: string,
  code: string | null,
  param: string | null = null,
): string {
  return `data: ${openaiErrorBody(message, type, code, param)}\n\n`;
}

/**
 * How a stream that failed ends: the error event, then `data: [DONE]`, as vLLM ends one
 * (`chat_completion_stream_generator` in vllm/entrypoints/openai/serving_chat.py yields the
 * error, then "data: [DONE]"). SDKs raise at the error; a client that reads until [DONE]
 * sees the stream end as it would from vLLM.
 */
export function sseErrorEnd(
  message: string,
  type: string,
  code: string | null,
  param: string | null = null,
): string {
  return sseError(message, type, code, param) + SSE_DONE;
}
