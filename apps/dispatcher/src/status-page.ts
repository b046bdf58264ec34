// The read-only status page on the metrics port: GET /status (HTML) and GET /status.json
// (what it polls). Every dispatcher serves it, leader or standby: the pools' figures are the
// leaders' published stats in Redis, so any dispatcher shows the same. They hold counts and
// names only, never request content.
import type { KeySpace } from '@sluice/protocol';
import { publishingPools, readPoolStats, type PublishedPool, type Redis } from '@sluice/redis';
import type { FastifyInstance } from 'fastify';
import { statusPageCsp, statusPageHtml } from './status-html.js';

export interface StatusPageDeps {
  id: string;
  redis: Redis;
  keys: KeySpace;
  /** The pools of this dispatcher's config, shown even while they have no leader. */
  configured: readonly string[];
  /** Pools this dispatcher leads, and those it stands by for. */
  roles: () => { leading: string[]; standby: string[] };
  now: () => number;
}

export interface StatusSnapshot {
  /** This dispatcher's clock at the reading: the page measures ages against it. */
  now: number;
  dispatcher: { id: string; redis: boolean; leading: string[]; standby: string[] };
  pools: PublishedPool[];
  /** Why the pools could not be read. */
  error?: string;
}

/**
 * Pools published under other configs are found by a SCAN, which walks every key (queued jobs
 * included): it runs at most this often, however many pages poll.
 */
const SCAN_INTERVAL_MS = 10_000;

export function statusSnapshots(deps: StatusPageDeps): () => Promise<StatusSnapshot> {
  let others: string[] = [];
  let scannedAt = Number.NEGATIVE_INFINITY;
  let pending: Promise<StatusSnapshot> | undefined;

  async function read(): Promise<StatusSnapshot> {
    const { redis, keys, now } = deps;
    const dispatcher = { id: deps.id, redis: redis.status === 'ready', ...deps.roles() };
    // A Redis that is away would only time out: say so at once.
    if (!dispatcher.redis)
      return { now: now(), dispatcher, pools: [], error: 'Redis is not connected' };
    try {
      if (now() - scannedAt >= SCAN_INTERVAL_MS) {
        others = await publishingPools(redis, keys);
        scannedAt = now();
      }
      const pools = await readPoolStats(redis, keys, [...deps.configured, ...others]);
      return { now: now(), dispatcher, pools };
    } catch (err) {
      return { now: now(), dispatcher, pools: [], error: (err as Error).message };
    }
  }

  // Pages polling at once share one reading.
  return () => (pending ??= read().finally(() => (pending = undefined)));
}

export function registerStatusPage(app: FastifyInstance, deps: StatusPageDeps): void {
  const snapshot = statusSnapshots(deps);
  app.get('/status', async (_request, reply) =>
    reply
      .type('text/html; charset=utf-8')
      .header('content-security-policy', statusPageCsp)
      .header('x-content-type-options', 'nosniff')
      .header('cache-control', 'no-store')
      .send(statusPageHtml),
  );
  app.get('/status.json', async (_request, reply) =>
    reply.header('cache-control', 'no-store').send(await snapshot()),
  );
}
