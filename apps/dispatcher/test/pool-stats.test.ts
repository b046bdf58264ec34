// The pool stats the leader publishes, on a real BullMQ queue and a fake clock: the drain rate
// the gateways turn into Retry-After counts the releases of the time this dispatcher led.
import type { PoolConfig } from '@sluice/config';
import { dispatcherMetrics, Registry } from '@sluice/observability';
import { decodePoolStats } from '@sluice/protocol';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Holding } from '../src/holding.ts';
import { HeldJobs } from '../src/held-jobs.ts';
import { InflightLedger } from '../src/ledger.ts';
import { PoolStats } from '../src/pool-stats.ts';
import { PrefillRate } from '../src/prefill-tracker.ts';
import { startQueueFixture, type QueueFixture } from './queue-fixture.ts';

let fx: QueueFixture;
beforeAll(async () => {
  fx = await startQueueFixture('pool-stats-test');
});
afterAll(async () => {
  await fx?.close();
});

const pool = {
  name: 'p',
  longPrompts: { thresholdTokens: 8192, maxShare: 0.5, maxInPrefill: 1, agingSeconds: 60 },
} as PoolConfig;

describe('PoolStats', () => {
  it('measures the first drain rate after a lease is won from the win, not from the standby time', async () => {
    let now = 1_000_000;
    let leader = false;
    const metrics = dispatcherMetrics(new Registry());
    const prefillRate = new PrefillRate();
    const failures: unknown[] = [];
    const stats = new PoolStats({
      id: 'd1',
      pool,
      keys: fx.keys,
      redis: fx.redis,
      queue: fx.queue,
      engines: [],
      ledger: new InflightLedger({ pool: 'p', metrics, prefillRate, now: () => now, changed() {} }),
      // Nothing is held: the holding's pruning has nothing to check.
      holding: { held: new HeldJobs(), prune: async () => {} } as unknown as Holding,
      prefillRate,
      policy: { kvThreshold: 0.9, failMode: 'open', maxGaugeAgeMs: 5000 },
      metrics,
      isLeader: () => leader,
      loadState: () => 'normal',
      mode: () => 'open',
      fairShare: undefined,
      now: () => now,
      failed: (err) => failures.push(err),
    });
    const published = async () => {
      await stats.publish();
      const raw = await fx.redis.get(fx.keys.poolStats('p'));
      return decodePoolStats(raw!);
    };

    // An hour on standby: its ticks read the queue and publish nothing.
    for (let s = 0; s < 3600; s += 600) {
      now += 600_000;
      await stats.publish();
    }
    expect(await fx.redis.exists(fx.keys.poolStats('p'))).toBe(0);

    leader = true;
    stats.leading();
    for (let i = 0; i < 20; i += 1) stats.released();
    now += 1000;
    // 20 jobs released in the first second of the lease.
    expect((await published()).drainPerSecond).toBe(20);
    expect(failures).toEqual([]);
  });
});
