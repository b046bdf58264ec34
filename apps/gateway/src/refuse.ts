// Every refusal in one shape: the OpenAI error body, `x-sluice-reject-reason`, and
// `Retry-After` where retrying can help (503 and 429, as RFC 9110 uses it).
import { openaiErrorBody } from '@sluice/openai';
import { rejectReasons, sluiceHeaders, type RejectReason } from '@sluice/protocol';
import type { ServerResponse } from 'node:http';

const errorTypes: Partial<Record<number, string>> = {
  400: 'invalid_request_error',
  404: 'invalid_request_error',
  413: 'invalid_request_error',
  415: 'invalid_request_error',
  429: 'rate_limit_error',
};

export interface Refusal {
  status: number;
  reason: RejectReason;
  message: string;
  retryAfter?: number;
}

export function refusal(reason: RejectReason, message: string, retryAfter?: number): Refusal {
  return { status: rejectReasons[reason], reason, message, retryAfter };
}

export function refusalHeaders(r: Refusal): Record<string, string> {
  const headers: Record<string, string> = {
    'content-type': 'application/json',
    [sluiceHeaders.rejectReason]: r.reason,
  };
  if (r.retryAfter !== undefined && (r.status === 503 || r.status === 429))
    headers['retry-after'] = String(r.retryAfter);
  return headers;
}

export function refusalBody(r: Refusal): string {
  const type = errorTypes[r.status] ?? (r.status >= 500 ? 'server_error' : 'invalid_request_error');
  return openaiErrorBody(r.message, type, r.reason, null);
}

/** Answers a client that has not been answered yet. */
export function writeRefusal(res: ServerResponse, r: Refusal): void {
  if (res.headersSent || res.destroyed) return;
  // 499 (client closed) is never sent: there is nobody to send it to.
  res.writeHead(r.status === 499 ? 503 : r.status, refusalHeaders(r));
  res.end(refusalBody(r));
}
