// Calls an engine with undici and relays its response as reply frames. The response body
// is passed through as bytes: the dispatcher never parses what the engine streams.
import type { EngineConfig } from '@sluice/config';
import { markStage } from '@sluice/observability';
import type { CompletionPath, EndInfo } from '@sluice/protocol';
import { Pool } from 'undici';
import { CancelledError } from './cancels.js';
import type { ReplyRelay } from './relay.js';

export interface EngineTimeouts {
  /** Until the response head: a prefill can take minutes. */
  headersTimeoutMs: number;
  /** Longest gap between two body chunks. */
  bodyTimeoutMs: number;
}

/** What the caller watches of a response body as it is relayed. */
export interface ResponseWatch {
  firstByte?(): void;
  data?(chunk: Buffer): void;
  /** At the end of the body: the token counts the end frame carries, if any. */
  end?(): EndInfo | undefined;
}

export type CallOutcome = 'ok' | 'engine_error' | 'engine_unreachable' | 'cancelled';

export class EngineClient {
  private readonly pool: Pool;
  private readonly authorization: string | undefined;

  constructor(
    readonly config: EngineConfig,
    timeouts: EngineTimeouts,
  ) {
    this.pool = new Pool(config.url, {
      headersTimeout: timeouts.headersTimeoutMs,
      bodyTimeout: timeouts.bodyTimeoutMs,
      // One connection per in-flight request: no request waits behind another's stream.
      connections: config.maxInflight,
      pipelining: 1,
      keepAliveTimeout: 30_000,
    });
    this.authorization = config.apiKey ? `Bearer ${config.apiKey}` : undefined;
  }

  get name(): string {
    return this.config.name;
  }

  /**
   * Sends `body` to the engine and relays the answer; never throws. `watch.firstByte` runs
   * once, at the first chunk of the response body (for a stream: the first token);
   * `watch.data` sees every chunk as it is relayed.
   */
  async call(
    path: CompletionPath,
    body: string | Buffer,
    relay: ReplyRelay,
    signal: AbortSignal,
    watch: ResponseWatch = {},
  ): Promise<CallOutcome> {
    let headSent = false;
    try {
      const headers: Record<string, string> = { 'content-type': 'application/json' };
      if (this.authorization) headers['authorization'] = this.authorization;
      const response = await this.pool.request({ path, method: 'POST', headers, body, signal });
      markStage('dispatcher.engine-head');
      const contentType = String(response.headers['content-type'] ?? 'application/json');
      relay.head({ status: response.statusCode, contentType });
      headSent = true;
      let first = watch.firstByte;
      const data = watch.data;
      for await (const chunk of response.body) {
        if (first) {
          first();
          first = undefined;
        }
        relay.data(chunk as Buffer);
        data?.(chunk as Buffer);
      }
      markStage('dispatcher.engine-end');
      relay.end(watch.end?.());
      return response.statusCode < 500 ? 'ok' : 'engine_error';
    } catch (err) {
      if (signal.aborted) {
        const why = signal.reason instanceof CancelledError ? signal.reason : undefined;
        relay.error({
          code: why?.frameCode ?? 'cancelled',
          message: `request cancelled: ${why?.message ?? 'cancelled'}`,
        });
        return 'cancelled';
      }
      const message = err instanceof Error ? err.message : String(err);
      relay.error(
        headSent
          ? {
              code: 'engine_error',
              message: `engine ${this.name} failed mid-response: ${message}`,
            }
          : {
              code: 'engine_unreachable',
              message: `engine ${this.name} unreachable: ${message}`,
            },
      );
      return headSent ? 'engine_error' : 'engine_unreachable';
    }
  }

  close(): Promise<void> {
    return this.pool.close();
  }
}
