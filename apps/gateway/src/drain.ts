// Shutting down with clients held (a rolling update). New requests are refused by the
// caller while this runs; held requests keep being served until none is left or the drain
// period ends. What is left then is answered: a queued client gets 503 `shutting_down` (a
// retry lands on another replica) and its job leaves the queue, so no engine ever runs it;
// a running stream gets the error in-band and its engine request is cancelled, freeing the
// slot at once instead of at the end of a generation nobody reads. Pass-through requests are
// drained the same way: served until they end or the period does, then ended by the gateway
// with the same reason (never `cancelled`: the client did not leave).
//
// The connections are drained too (DrainingConnections): a pooled client, balanced per
// connection, would otherwise send every retry back here on the same kept-alive socket.
import type { Server, ServerResponse } from 'node:http';
import { refusal } from './refuse.js';
import type { HeldRequest } from './held-request.js';
import type { Passthrough } from './passthrough.js';
import type { ReplyRouter } from './replies.js';

export interface DrainResult {
  /** Held requests answered `shutting_down` at the end of the drain period. */
  cut: number;
  /** Pass-through requests ended `shutting_down` at the end of the drain period. */
  passthroughCut: number;
}

export async function drain(
  replies: ReplyRouter,
  passthrough: Pick<Passthrough, 'whenIdle' | 'cutAll'>,
  drainMs: number,
  cutShort: Promise<void>,
): Promise<DrainResult> {
  let timer: NodeJS.Timeout | undefined;
  const deadline = new Promise<void>((resolve) => {
    timer = setTimeout(resolve, drainMs);
  });
  await Promise.race([
    Promise.all([replies.whenIdle(), passthrough.whenIdle()]),
    deadline,
    cutShort,
  ]);
  clearTimeout(timer);
  // Pass-through requests hold no gated engine slot, so ending them first frees nothing the
  // dispatcher could hand to a queued job.
  const passthroughCut = passthrough.cutAll(
    refusal('shutting_down', 'this gateway replica is shutting down; the answer is incomplete'),
  );
  const left = [...replies.held.values()];
  const answer = (held: HeldRequest) =>
    held.abandon(
      refusal(
        'shutting_down',
        held.state === 'queued'
          ? 'this gateway replica is shutting down and the request was not served yet; retry'
          : 'this gateway replica is shutting down; the answer is incomplete',
      ),
      'shutting_down',
    );
  // Queued jobs leave the queue before any running request is cut: a cut frees an engine
  // slot, and the dispatcher would hand it to a queued job whose removal had not landed yet.
  const queued = left.filter((held) => held.state === 'queued');
  const running = left.filter((held) => held.state !== 'queued');
  await Promise.all(queued.map(answer).map((takeBack) => takeBack()));
  await Promise.all(running.map(answer).map((takeBack) => takeBack()));
  await passthrough.whenIdle();
  return { cut: left.length, passthroughCut };
}

/**
 * The HTTP side of a drain. From its start every response carries `Connection: close` (one
 * whose head went out before is closed once it ends), and idle kept-alive connections are
 * closed, so a client's next request opens a new connection, which the load balancer gives
 * another replica. Requests in progress are never cut here.
 */
export class DrainingConnections {
  /** Responses not yet finished. */
  private readonly open = new Set<ServerResponse>();
  private draining = false;

  constructor(private readonly server: Server) {
    // First among the listeners: a response written at once must already see the drain.
    server.prependListener('request', (_req, res: ServerResponse) => this.track(res));
  }

  start(): void {
    this.draining = true;
    for (const res of this.open) if (!res.headersSent) res.shouldKeepAlive = false;
    this.closeIdle();
  }

  private track(res: ServerResponse): void {
    if (this.draining) res.shouldKeepAlive = false;
    this.open.add(res);
    const ended = () => {
      if (!this.open.delete(res)) return;
      // A response whose head said keep-alive leaves its connection idle now.
      this.closeIdle();
    };
    res.once('finish', ended);
    res.once('close', ended);
  }

  /**
   * Node counts a connection idle once `end()` was called on its response, bytes still
   * unflushed included, and destroys it: a large answer to a slow reader would be cut. While
   * one is flushing, its own 'finish' does the closing instead.
   */
  private closeIdle(): void {
    if (!this.draining) return;
    for (const res of this.open) if (res.writableEnded && !res.writableFinished) return;
    this.server.closeIdleConnections();
  }
}
