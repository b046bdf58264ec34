// Ungated backends (embeddings, Ollama, anything not observed): proxied straight through
// with undici, the response streamed unbuffered.
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

export class Passthrough {
  private readonly agent = new Agent({ headersTimeout: 900_000, bodyTimeout: 300_000 });

  async forward(
    baseUrl: string,
    path: string,
    headers: IncomingHttpHeaders,
    body: Buffer,
    res: ServerResponse,
  ): Promise<void> {
    const controller = new AbortController();
    res.once('close', () => controller.abort());
    try {
      const upstream = await request(new URL(path, baseUrl), {
        method: 'POST',
        dispatcher: this.agent,
        headers: {
          'content-type': 'application/json',
          ...(headers.authorization ? { authorization: headers.authorization } : {}),
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
