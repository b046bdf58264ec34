// What /status.json says, read from a real Redis: the configured pools, whether published or
// not, pools other dispatchers publish, and a Redis that is away named rather than waited on.
import { encodePoolStats, keySpace, type PoolStats } from '@sluice/protocol';
import { createRedis, redisReady } from '@sluice/redis';
import { freePort, startRedis } from '@sluice/test/support';
import Fastify from 'fastify';
import { describe, expect, it } from 'vitest';
import { registerStatusPage, statusSnapshots, type StatusPageDeps } from '../src/status-page.ts';

const keys = keySpace('sluice');
const stats: PoolStats = {
  leader: 'd-other',
  at: 1000,
  drainPerSecond: 2,
  engines: [{ name: 'e1', inflight: 2, cap: 4, open: true }],
  queue: { wait: 5, prioritized: 1, active: 2, delayed: 0 },
  mode: 'paused',
  oldestQueuedMs: 1500,
};

function deps(redis: StatusPageDeps['redis']): StatusPageDeps {
  return {
    id: 'd-here',
    redis,
    keys,
    configured: ['chat', 'batch'],
    roles: () => ({ leading: ['chat'], standby: ['batch'] }),
    now: () => 2000,
  };
}

describe('status snapshots', () => {
  it('lists the configured pools and those published elsewhere, with who serves the page', async () => {
    const server = await startRedis();
    const redis = createRedis(server.url, { name: 'sluice:test:status', role: 'command' });
    try {
      await redisReady(redis);
      await redis.set(keys.poolStats('chat'), encodePoolStats(stats));
      await redis.set(keys.poolStats('elsewhere'), encodePoolStats({ ...stats, mode: 'open' }));
      expect(await statusSnapshots(deps(redis))()).toEqual({
        now: 2000,
        dispatcher: { id: 'd-here', redis: true, leading: ['chat'], standby: ['batch'] },
        pools: [
          { pool: 'batch' },
          { pool: 'chat', stats },
          { pool: 'elsewhere', stats: { ...stats, mode: 'open' } },
        ],
      });
    } finally {
      redis.disconnect();
      await server.stop();
    }
  });

  it('says Redis is not connected instead of waiting for it, and serves the page meanwhile', async () => {
    const redis = createRedis(`redis://127.0.0.1:${await freePort()}`, {
      name: 'sluice:test:status',
      role: 'command',
    });
    redis.on('error', () => {});
    const app = Fastify();
    registerStatusPage(app, deps(redis));
    try {
      const json = await app.inject({ url: '/status.json' });
      expect(json.statusCode).toBe(200);
      expect(json.json()).toMatchObject({
        dispatcher: { id: 'd-here', redis: false },
        pools: [],
        error: 'Redis is not connected',
      });
      const page = await app.inject({ url: '/status' });
      expect(page.statusCode).toBe(200);
      expect(page.headers['content-type']).toBe('text/html; charset=utf-8');
      expect(page.body).toContain('<title>Sluice status</title>');
      // Only the page's own script may run, and it fetches only from this server.
      expect(page.headers['content-security-policy']).toMatch(
        /script-src 'sha256-[A-Za-z0-9+/]+=*'; .*connect-src 'self'/,
      );
      // Read-only: nothing but GET (and HEAD).
      expect((await app.inject({ method: 'POST', url: '/status.json' })).statusCode).toBe(404);
    } finally {
      await app.close();
      redis.disconnect();
    }
  });
});
