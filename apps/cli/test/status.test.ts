import { keySpace } from '@sluice/protocol';
import { createRedis, redisReady } from '@sluice/redis';
import { startRedis } from '@sluice/test/support';
import { describe, expect, it } from 'vitest';
import { formatStatus, readPools, redisLine } from '../src/status.ts';

describe('sluice status output', () => {
  it('shows queue, in-flight/cap, gate and gauges with their age per engine', () => {
    const text = formatStatus(
      [
        {
          pool: 'reasoning',
          stats: {
            leader: 'd1',
            at: 10_000,
            drainPerSecond: 1.5,
            loadState: 'tired',
            queue: { wait: 2, prioritized: 1, active: 4 },
            engines: [
              {
                name: 'vllm-0',
                inflight: 4,
                cap: 4,
                open: false,
                reason: 'inflight_cap',
                health: 'healthy',
                running: 4,
                waiting: 0,
                kvUsage: 0.4215,
                scrapedAt: 9_500,
              },
              {
                name: 'vllm-1',
                inflight: 0,
                cap: 4,
                open: false,
                reason: 'engine_stale',
                health: 'stale',
              },
            ],
          },
        },
        { pool: 'idle', stats: undefined },
      ],
      10_000,
    );
    expect(text).toBe(
      [
        'pool reasoning  leader d1  drain 1.50/s  load tired  queue: wait 2 prioritized 1 active 4',
        '  engine vllm-0  in-flight 4/4  gate closed (inflight_cap)  state healthy  running 4 waiting 0 kv 42.1%  read 0.5 s ago',
        '  engine vllm-1  in-flight 0/4  gate closed (engine_stale)  state stale  gauges: none yet',
        'pool idle: no leader (no dispatcher has published for 5 s)',
        '',
      ].join('\n'),
    );
  });

  it('shows the jobs held back and the long prompts in prefill', () => {
    const text = formatStatus(
      [
        {
          pool: 'p',
          stats: {
            leader: 'd1',
            at: 0,
            drainPerSecond: 0.25,
            queue: { wait: 0, prioritized: 1, active: 2, delayed: 3 },
            longs: {
              held: 3,
              heldTokens: 98_304,
              inPrefill: 1,
              prefillRemainingTokens: 40_000,
              prefillTokensPerSecond: 301.7,
              parallelPrefills: 1,
            },
            engines: [],
          },
        },
      ],
      0,
    );
    expect(text).toBe(
      [
        'pool p  leader d1  drain 0.25/s  queue: wait 0 prioritized 1 active 2 held 3',
        '  long prompts: 3 held (98304 tokens), 1 in prefill, prefill 302 tok/s',
        '',
      ].join('\n'),
    );
  });

  it("shows each tenant's queue, its share of the running work, weight and counter", () => {
    const text = formatStatus(
      [
        {
          pool: 'p',
          stats: {
            leader: 'd1',
            at: 0,
            drainPerSecond: 1,
            engines: [],
            tenants: {
              alpha: { queued: 20, inflight: 1, weight: 1, virtualTokens: 1200.4 },
              beta: { queued: 3, inflight: 3, weight: 2, virtualTokens: 1100 },
            },
          },
        },
      ],
      0,
    );
    expect(text).toBe(
      [
        'pool p  leader d1  drain 1.00/s',
        '  tenant alpha  queued 20  in-flight 1 (25% of running)  weight 1  virtual tokens 1200',
        '  tenant beta  queued 3  in-flight 3 (75% of running)  weight 2  virtual tokens 1100',
        '',
      ].join('\n'),
    );
  });

  it('says so when no dispatcher has published anything', () => {
    expect(formatStatus([], 0)).toMatch(/^no pools/);
  });
});

describe('sluice status: which Redis', () => {
  it('names a single node without its password', async () => {
    const server = await startRedis({ password: 'pw' });
    const redis = createRedis(server.url, { name: 'status-test', role: 'command' });
    try {
      await redisReady(redis);
      expect(await redisLine({ kind: 'single', url: server.url }, redis)).toBe(
        `redis: single redis://***@127.0.0.1:${server.port}\n`,
      );
    } finally {
      redis.disconnect();
      await server.stop();
    }
  });

  it('says why the master is unknown when no sentinel answers', async () => {
    const server = await startRedis();
    const redis = createRedis(server.url, { name: 'status-test', role: 'command' });
    try {
      await redisReady(redis);
      const line = await redisLine(
        { kind: 'sentinel', sentinels: [{ host: '127.0.0.1', port: 1 }], masterName: 'm' },
        redis,
      );
      expect(line).toMatch(
        /^redis: sentinel m via 127\.0\.0\.1:1 {2}master unknown \(no sentinel named the master m \(127\.0\.0\.1:1: .+\)\)\n$/,
      );
    } finally {
      redis.disconnect();
      await server.stop();
    }
  });
});

describe('sluice status: a pool drained while no dispatcher leads it', () => {
  it('is listed from its control key, with its mode and how to open it', async () => {
    const server = await startRedis();
    const redis = createRedis(server.url, { name: 'status-test', role: 'command' });
    const keys = keySpace('sluice');
    try {
      await redisReady(redis);
      // No configuration names it, no dispatcher publishes for it.
      await redis.set(keys.poolControl('default'), 'draining');
      const pools = await readPools(redis, keys, []);
      expect(pools).toEqual([{ pool: 'default', control: 'draining' }]);
      expect(formatStatus(pools, 0)).toBe(
        'pool default: no leader (no dispatcher has published for 5 s)  mode draining in Redis (`sluice pool resume default` opens it)\n',
      );
    } finally {
      redis.disconnect();
      await server.stop();
    }
  });
});
