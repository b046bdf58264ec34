// Ungated backends (embeddings, Ollama, anything not observed): proxied straight through
// with undici, the response streamed unbuffered.
//
// The backend's Authorization is its own `apiKey` when the file gives one. Without one, the
// client's header is forwarded only when no tenants are configured (as before tenants
// existed: the client's key was meant for the backend); with tenants the client's key is a
// Sluice key, which no backend may see, so the backend gets none.
import type { IncomingHttpHeaders, ServerResponse } from 'node:http';
import { pipeline } from 'node:stream/promises';
import { Agent, request } from 'undici';
import { refusal, writeRefusal } from './refuse.js';

const hopByHop = new Set([
  'connection',
  'keep-alive',
  'transfer-encoding',
  'upgrade',
  'proxy-connection',
  'te',
  'trailer',
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
  ): Promise<void> {
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
    } catch (err) {
      if (controller.signal.aborted) return;
      if (!res.headersSent)
        writeRefusal(
          res,
          refusal(
            'engine_unreachable',
            `backend ${baseUrl} unreachable: ${(err as Error).message}`,
            5,
          ),
        );
      else res.destroy();
    }
  }

  close(): Promise<void> {
    return this.agent.close();
  }
}
