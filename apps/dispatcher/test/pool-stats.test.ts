// The pool stats the leader publishes, on a real BullMQ queue and a fake clock: the drain rate
// the gateways turn into Retry-After counts the releases of the time this dispatcher led, and
// only of the windows in which jobs waited (queued, or every engine at its cap).
import type { PoolConfig } from '@sluice/config';
import { dispatcherMetrics, Registry } from '@sluice/observability';
import { retryAfterSeconds } from '@sluice/admission';
import { decodePoolStats } from '@sluice/protocol';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { EngineSlot } from '../src/engine-slot.ts';
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
// Each test starts with an empty queue and no stats.
afterEach(async () => {
  await fx.queue.drain(true);
  await fx.redis.del(fx.keys.poolStats('p'));
});

const pool = {
  name: 'p',
  longPrompts: { thresholdTokens: 8192, maxShare: 0.5, maxInPrefill: 1, agingSeconds: 60 },
} as PoolConfig;

/** A leader's (or standby's) PoolStats on the fixture's queue, with a clock the test moves. */
function poolStats(engines: EngineSlot[] = []) {
  const clock = { now: 1_000_000, leader: false };
  const metrics = dispatcherMetrics(new Registry());
  const prefillRate = new PrefillRate();
  const failures: unknown[] = [];
  const stats = new PoolStats({
    id: 'd1',
    pool,
    keys: fx.keys,
    redis: fx.redis,
    queue: fx.queue,
    engines,
    ledger: new InflightLedger({
      pool: 'p',
      metrics,
      prefillRate,
      now: () => clock.now,
      changed() {},
    }),
    // Nothing is held: the holding's pruning has nothing to check.
    holding: { held: new HeldJobs(), prune: async () => {} } as unknown as Holding,
    prefillRate,
    policy: { kvThreshold: 0.9, failMode: 'open', maxGaugeAgeMs: 5000 },
    metrics,
    isLeader: () => clock.leader,
    loadState: () => 'normal',
    mode: () => 'open',
    fairShare: undefined,
    now: () => clock.now,
    failed: (err) => failures.push(err),
  });
  /** One second passes with `released` jobs released; the tick's publication. */
  const second = async (released: number) => {
    for (let i = 0; i < released; i += 1) stats.released();
    clock.now += 1000;
    await stats.publish();
    const raw = await fx.redis.get(fx.keys.poolStats('p'));
    return decodePoolStats(raw!);
  };
  return { stats, clock, failures, second };
}

/** An engine as the stats read it: `inflight` of `cap` slots taken, no gauges yet. */
const engine = (inflight: number, cap: number) =>
  ({ name: 'e', lane: 'any', inflight, cap, health: 'unknown' }) as unknown as EngineSlot;

describe('PoolStats', () => {
  it('measures the first drain rate after a lease is won from the win, not from the standby time', async () => {
    const { stats, clock, failures, second } = poolStats();
    // Jobs wait all along, for the standby to take over.
    await fx.queue.add('j', {});

    // An hour on standby: its ticks read the queue and publish nothing.
    for (let s = 0; s < 3600; s += 600) {
      clock.now += 600_000;
      await stats.publish();
    }
    expect(await fx.redis.exists(fx.keys.poolStats('p'))).toBe(0);

    clock.leader = true;
    stats.leading();
    // 20 jobs released in the first second of the lease.
    expect((await second(20)).drainPerSecond).toBe(20);
    expect(failures).toEqual([]);
  });

  it('keeps the rate of the last backlog through an idle spell: a burst after it is told 3 s, not 60', async () => {
    const { stats, clock, failures, second } = poolStats();
    clock.leader = true;
    stats.leading();
    // A backlog drained at 4 jobs a second...
    await fx.queue.add('j', {});
    for (let s = 0; s < 3; s += 1) expect((await second(4)).drainPerSecond).toBe(4);
    // ...to its end (the window it ended in still counts: jobs waited at its start)...
    await fx.queue.drain(true);
    expect((await second(4)).drainPerSecond).toBe(4);
    // ...then 30 s with nothing to drain.
    let published = await second(0);
    for (let s = 1; s < 30; s += 1) published = await second(0);
    expect(published.drainPerSecond).toBe(4);
    // The burst that fills the queue (8 deep) is refused with the pool's real pace.
    expect(retryAfterSeconds({ queued: 8, drainPerSecond: published.drainPerSecond })).toBe(3);
    expect(failures).toEqual([]);
  });

  it('counts a window in which every engine was at its cap, and not one with room and no queue', async () => {
    const full = poolStats([engine(2, 2)]);
    full.clock.leader = true;
    full.stats.leading();
    expect((await full.second(3)).drainPerSecond).toBe(3);

    // Releases while nothing waited follow the requests, not the pool: the rate stays unknown
    // (published as 0, which the gateways answer with 5 s).
    const roomy = poolStats([engine(1, 2)]);
    roomy.clock.leader = true;
    roomy.stats.leading();
    expect((await roomy.second(3)).drainPerSecond).toBe(0);
    expect(full.failures).toEqual([]);
    expect(roomy.failures).toEqual([]);
  });
});
