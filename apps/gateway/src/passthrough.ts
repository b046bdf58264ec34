// Ungated backends (embeddings, Ollama, anything not observed): proxied straight through
// with undici, the response streamed unbuffered.
//
// The backend's Authorization is its own `apiKey` when the file gives one. Without one, the
// client's header is forwarded only when no tenants are configured (as before tenants
// existed: the client's key was meant for the backend); with tenants the client's key is a
// Sluice key, which no backend may see, so the backend gets none.
import type { IncomingHttpHeaders, ServerResponse } from 'node:http';
import { pipeline } from 'node:stream/promises';
import type { RejectReason } from '@sluice/protocol';
import { Agent, request } from 'undici';
import { REQUEST_ID_HEADER } from './request-id.js';
import { refusal, writeRefusal } from './refuse.js';

const hopByHop = new Set([
  'connection',
  'keep-alive',
  'transfer-encoding',
  'upgrade',
  'proxy-connection',
  'te',
  'trailer',
  // The answer carries the gateway's request id (set on the response), not the backend's.
  REQUEST_ID_HEADER,
]);

/** Where a pass-through request goes: the backend's origin and its own key, if any. */
export interface PassthroughTarget {
  readonly url: string;
  readonly apiKey?: string;
}

/** The Authorization header the backend gets, if any (see the top of this file). */
export function backendAuthorization(
  target: PassthroughTarget,
  clientAuthorization: string | undefined,
  tenants: boolean,
): string | undefined {
  if (target.apiKey !== undefined) return `Bearer ${target.apiKey}`;
  return tenants ? undefined : clientAuthorization;
}

/** How a pass-through request ended, for the access log and the response metrics. */
export interface PassthroughAnswer {
  /** The backend's status; the refusal's when Sluice answered; 499 when the client left. */
  status: number;
  reason?: RejectReason;
}

export class Passthrough {
  private readonly agent = new Agent({ headersTimeout: 900_000, bodyTimeout: 300_000 });

  /** `tenants`: whether client keys are Sluice's own (then never forwarded). */
  constructor(private readonly tenants: boolean) {}

  async forward(
    target: PassthroughTarget,
    path: string,
    headers: IncomingHttpHeaders,
    body: Buffer,
    res: ServerResponse,
  ): Promise<PassthroughAnswer> {
    const baseUrl = target.url;
    const controller = new AbortController();
    res.once('close', () => controller.abort());
    const authorization = backendAuthorization(target, headers.authorization, this.tenants);
    try {
      const upstream = await request(new URL(path, baseUrl), {
        method: 'POST',
        dispatcher: this.agent,
        headers: {
          'content-type': 'application/json',
          // The backend sees the id the access log names the request by.
          [REQUEST_ID_HEADER]: String(res.getHeader(REQUEST_ID_HEADER) ?? ''),
          ...(authorization ? { authorization } : {}),
        },
        body,
        signal: controller.signal,
      });
      const out: Record<string, string | string[]> = {};
      for (const [name, value] of Object.entries(upstream.headers))
        if (value !== undefined && !hopByHop.has(name)) out[name] = value;
      res.writeHead(upstream.statusCode, out);
      await pipeline(upstream.body, res);
      return { status: upstream.statusCode };
    } catch (err) {
      if (controller.signal.aborted) return { status: 499, reason: 'cancelled' };
      if (!res.headersSent) {
        const r = refusal(
          'engine_unreachable',
          `backend ${baseUrl} unreachable: ${(err as Error).message}`,
          5,
        );
        writeRefusal(res, r);
        return { status: r.status, reason: r.reason };
      }
      res.destroy();
      // The backend failed mid-answer: what its status promised did not arrive whole.
      const r = refusal('engine_error', `backend ${baseUrl} failed mid-answer`);
      return { status: r.status, reason: r.reason };
    }
  }

  close(): Promise<void> {
    return this.agent.close();
  }
}
