// The leader's fair share against a real redis-server and BullMQ: the take after
// `prepareNext` is the job of the tenant with the least weighted service, and the counters
// a leader wrote are where the next leader goes on from.
import type { TenantConfig } from '@sluice/config';
import { dispatcherMetrics, Registry } from '@sluice/observability';
import { keySpace, type JobPayload } from '@sluice/protocol';
import type { Redis } from '@sluice/redis';
import type { Queue, Worker } from 'bullmq';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { startQueueFixture, type QueueFixture } from './queue-fixture.ts';
import { DEFAULT_OUTPUT_PER_SEQUENCE, FairShare } from '../src/fair-share.ts';

let fixture: QueueFixture;
let redis: Redis;
let bull: Redis;
let queue: Queue;
let worker: Worker;
const keys = keySpace('fair-test');
const tenants: TenantConfig[] = [
  { name: 'alpha', keySha256: ['a'.repeat(64)], weight: 1, maxPriority: 0 },
  { name: 'beta', keySha256: ['b'.repeat(64)], weight: 1, maxPriority: 0 },
];
const silent = { warn: () => {} };
/** The dispatcher whose lease the tests' fair shares write under. */
const LEADER = 'leader';

beforeAll(async () => {
  fixture = await startQueueFixture('fair-test');
  ({ redis, bull, queue, worker } = fixture);
});
beforeEach(async () => {
  await redis.flushall();
  await redis.set(keys.lease('p'), LEADER);
});
afterAll(() => fixture.close());

let registry: Registry;
const fairShare = () =>
  new FairShare({
    pool: 'p',
    tenants,
    keys,
    redis,
    bull,
    queue,
    lease: { key: keys.lease('p'), owner: LEADER },
    metrics: dispatcherMetrics((registry = new Registry())),
    log: silent,
  });

/** `sluice_fair_share_picks_total` of the last FairShare made, by outcome. */
async function picks(): Promise<Record<string, number>> {
  const metric = await registry.getSingleMetric('sluice_fair_share_picks_total')!.get();
  return Object.fromEntries(metric.values.map((v) => [String(v.labels['outcome']), v.value]));
}

const payload = (tenant: string): JobPayload => ({
  v: 1,
  body: '{}',
  path: '/v1/chat/completions',
  stream: true,
  replica: 'gw',
  enqueuedAt: 0,
  deadline: 1,
  priority: 0,
  promptTokens: 100,
  tenant,
});

async function add(tenant: string, id: string, data = payload(tenant)): Promise<void> {
  await queue.add('completion', data, { jobId: id, priority: 1 });
  await redis.zadd(keys.tenantQueued('p', tenant), 1, id);
}

/** `sluice_fair_share_readings_total` of the last FairShare made, by source. */
async function readings(): Promise<Record<string, number>> {
  const metric = await registry.getSingleMetric('sluice_fair_share_readings_total')!.get();
  return Object.fromEntries(metric.values.map((v) => [String(v.labels['source']), v.value]));
}

/** Prepares and takes the next job as the release loop does, then releases it. */
async function releaseNext(fair: FairShare, n: number): Promise<string> {
  await fair.prepareNext();
  const job = await worker.getNextJob(`tok${n}`, { block: false });
  fair.taken(job?.id, false);
  expect(job).toBeDefined();
  fair.released(job!.id!, job!.data as JobPayload);
  return `${(job!.data as JobPayload).tenant}:${job!.id}`;
}

describe('fair share (leader side)', () => {
  it("releases a late tenant's jobs among the first one's backlog, not after it", async () => {
    for (let i = 0; i < 6; i += 1) await add('alpha', `a${i}`);
    const fair = fairShare();
    await fair.load();
    const order = [await releaseNext(fair, 0), await releaseNext(fair, 1)];
    for (let i = 0; i < 2; i += 1) await add('beta', `b${i}`);
    for (let i = 2; i < 8; i += 1) order.push(await releaseNext(fair, i));
    // First come, first served would be a0..a5 then b0, b1. Beta starts at alpha's counter
    // (idle time is not banked), and a tie goes to the tenant configured first. Each pick uses
    // the reading sent with the take before it, so beta, which arrived between two takes, is
    // first seen by the pick after next (a3's take was the first to carry a reading with it).
    expect(order).toEqual([
      'alpha:a0',
      'alpha:a1',
      'alpha:a2',
      'alpha:a3',
      'beta:b0',
      'alpha:a4',
      'beta:b1',
      'alpha:a5',
    ]);
    expect(await redis.zcard(keys.tenantQueued('p', 'alpha'))).toBe(0);
    expect(await redis.zcard(keys.tenantQueued('p', 'beta'))).toBe(0);
    // Beta's two went to the front; every other pick was the queue's own next job.
    expect(await picks()).toEqual({ in_order: 6, moved: 2 });
    // Only the first pick read on its own: every take got the job its reading said was next.
    expect(await readings()).toEqual({ own: 1, ahead: 7 });
  });

  it('reads on its own after a take that waited, got another job, or took a promoted one', async () => {
    for (let i = 0; i < 5; i += 1) await add('alpha', `a${i}`);
    const fair = fairShare();
    await fair.load();
    expect(await releaseNext(fair, 0)).toBe('alpha:a0');
    // A take that waited for BullMQ's marker: its reading may predate what it took.
    await fair.prepareNext();
    const waited = await worker.getNextJob('tok1', { block: false });
    fair.taken(waited!.id, true);
    fair.released(waited!.id!, waited!.data as JobPayload);
    expect(await releaseNext(fair, 2)).toBe('alpha:a2');
    // A take that got another job than the reading's next.
    await fair.prepareNext();
    fair.taken('someone-else', false);
    expect(await releaseNext(fair, 3)).toBe('alpha:a3');
    // A promoted held job's take: no pick, and the reading ahead is dropped.
    fair.promotedFirst();
    expect(await releaseNext(fair, 4)).toBe('alpha:a4');
    expect(await readings()).toEqual({ own: 4, ahead: 2 });
  });

  it('gives back the charge of a job the runner skipped: its tenant keeps its place in the order', async () => {
    for (const id of ['a0', 'a1']) await add('alpha', id);
    await add('beta', 'b0');
    const fair = fairShare();
    await fair.load();
    expect(await releaseNext(fair, 0)).toBe('alpha:a0');
    // Charged at release: alpha is behind beta now.
    expect(fair.view()['alpha']!.virtualTokens).toBe(100);
    // a0's client left before it ran (job-runner.ts, `skip`): alpha got nothing.
    fair.notRun('a0', payload('alpha'));
    fair.ended(payload('alpha'));
    expect(fair.view()['alpha']).toMatchObject({ virtualTokens: 0, inflight: 0 });
    // A tie again, which goes to the tenant configured first.
    expect(await releaseNext(fair, 1)).toBe('alpha:a1');
    expect(await releaseNext(fair, 2)).toBe('beta:b0');
    await fair.flush();
    expect(await redis.hget(keys.fairShare('p'), 'alpha')).toBe('100');
  });

  it('charges output as it streams, and hands its counters to the next leader', async () => {
    const fair = fairShare();
    await fair.load();
    await add('alpha', 'a0');
    await add('beta', 'b0');
    expect(await releaseNext(fair, 0)).toBe('alpha:a0');
    fair.output('alpha', 50);
    await fair.flush();
    const stored = await redis.hgetall(keys.fairShare('p'));
    const next = fairShare();
    await next.load();
    expect(next.view()['alpha']!.virtualTokens).toBe(fair.view()['alpha']!.virtualTokens);
    expect(Number(stored['alpha'])).toBe(fair.view()['alpha']!.virtualTokens);
    // Output weighs twice input (VTC's w_q = 2 w_p): 100 in + 50 out = 200.
    expect(fair.view()['alpha']!.virtualTokens).toBe(200);
    // The next leader picks the tenant its predecessor served less: beta, waiting all along,
    // is not lifted to alpha's counter as a tenant that just became active would be.
    await add('alpha', 'a1');
    expect(await releaseNext(next, 1)).toBe('beta:b0');
  });

  it("writes no counters once its lease is another dispatcher's: the next leader's stand", async () => {
    const fair = fairShare();
    await fair.load();
    await add('alpha', 'a0');
    expect(await releaseNext(fair, 0)).toBe('alpha:a0');
    await fair.flush();
    expect(await redis.hget(keys.fairShare('p'), 'alpha')).toBe('100');
    // Its renewal ran late: the lease expired and a standby took it, then went on from 100.
    await redis.set(keys.lease('p'), 'standby');
    await redis.hset(keys.fairShare('p'), 'alpha', '250');
    fair.output('alpha', 50);
    await fair.flush();
    expect(await redis.hget(keys.fairShare('p'), 'alpha')).toBe('250');
  });

  describe("a non-streamed job's output, reserved at release", () => {
    /** A non-streamed job of `tenant`: 100 prompt tokens, and `more` as a gateway writes it. */
    const whole = (tenant: string, more: Partial<JobPayload> = {}): JobPayload => ({
      ...payload(tenant),
      stream: false,
      ...more,
    });
    const virtual = (fair: FairShare, tenant: string) => fair.view()[tenant]!.virtualTokens;
    /** `sluice_tenant_tokens_total{kind="output"}` of the last FairShare made, for `tenant`. */
    async function outputTokens(tenant: string): Promise<number> {
      const metric = await registry.getSingleMetric('sluice_tenant_tokens_total')!.get();
      return (
        metric.values.find((v) => v.labels['tenant'] === tenant && v.labels['kind'] === 'output')
          ?.value ?? 0
      );
    }

    it('charges its limit per sequence at release, so the next pick sees it', async () => {
      // a0 is not streamed: nothing will be seen of its output until it is whole.
      await add('alpha', 'a0', whole('alpha', { maxTokens: 50, sequences: 2 }));
      await add('alpha', 'a1');
      for (const id of ['b0', 'b1']) await add('beta', id);
      const fair = fairShare();
      await fair.load();
      expect(await releaseNext(fair, 0)).toBe('alpha:a0');
      // 100 prompt tokens, and 2 x 50 output tokens weighted twice.
      expect(virtual(fair, 'alpha')).toBe(100 + 2 * 2 * 50);
      // A streamed job reserves nothing: its output is charged as it passes.
      expect(await releaseNext(fair, 1)).toBe('beta:b0');
      expect(virtual(fair, 'beta')).toBe(100);
      // Beta, at 100, is still behind alpha's 300: its next job goes before alpha's.
      expect(await releaseNext(fair, 2)).toBe('beta:b1');
      // Nothing is counted as output served yet: only what the engine reports is.
      expect(await outputTokens('alpha')).toBe(0);
    });

    it("replaces the reservation by the engine's usage when the run reports it", async () => {
      const fair = fairShare();
      await fair.load();
      const job = whole('alpha', { maxTokens: 500 });
      fair.released('a0', job);
      expect(virtual(fair, 'alpha')).toBe(100 + 2 * 500);
      fair.outputEnded('a0', job, 30, false);
      expect(virtual(fair, 'alpha')).toBe(100 + 2 * 30);
      expect(await outputTokens('alpha')).toBe(30);
      // Settled once: a second end changes nothing.
      fair.outputEnded('a0', job, undefined, true);
      expect(virtual(fair, 'alpha')).toBe(100 + 2 * 30);
    });

    it('keeps the reservation charged when the run ends without usage (cancelled, timed out, failed)', async () => {
      const fair = fairShare();
      await fair.load();
      const job = whole('alpha', { maxTokens: 200 });
      for (const id of ['a0', 'a1', 'a2']) {
        fair.released(id, job);
        fair.outputEnded(id, job, undefined, false);
        fair.ended(job);
      }
      // Three abandoned answers cost their prompts and their limits, not the prompts alone.
      expect(virtual(fair, 'alpha')).toBe(3 * (100 + 2 * 200));
      expect(await outputTokens('alpha')).toBe(0);
      await fair.flush();
      expect(await redis.hget(keys.fairShare('p'), 'alpha')).toBe(String(3 * (100 + 2 * 200)));
      // A request the engine refused (a 4xx, no usage) generated nothing: given back.
      fair.released('a3', job);
      fair.outputEnded('a3', job, undefined, true);
      expect(virtual(fair, 'alpha')).toBe(4 * 100 + 3 * 2 * 200);
    });

    it('keeps open reservations charged at a hand-over, so the last write never lowers a counter the next leader goes on from', async () => {
      const fair = fairShare();
      await fair.load();
      const job = whole('alpha', { maxTokens: 200 });
      fair.released('a0', job);
      fair.released('a1', job);
      await fair.flush();
      const periodic = Number(await redis.hget(keys.fairShare('p'), 'alpha'));
      // Output weighs twice.
      expect(periodic).toBe(2 * 100 + 2 * 2 * 200);
      fair.outputEnded('a1', job, 20, false);
      expect(virtual(fair, 'alpha')).toBe(2 * 100 + 2 * 200 + 2 * 20);
      // a0 still runs when this leader closes (pool-dispatcher.ts, close).
      fair.handOver();
      await fair.flush();
      const last = 2 * 100 + 2 * 200 + 2 * 20;
      expect(await redis.hget(keys.fairShare('p'), 'alpha')).toBe(String(last));
      // Its run ends after the last write: nothing is left reserved for it to give back.
      fair.outputEnded('a0', job, 5, false);
      expect(virtual(fair, 'alpha')).toBe(last + 2 * 5);
    });

    it('gives the reservation back with the input charge when the job is not run', async () => {
      for (const id of ['a0', 'a1']) await add('alpha', id);
      await add('beta', 'b0');
      const fair = fairShare();
      await fair.load();
      await fair.prepareNext();
      const job = await worker.getNextJob('tok0', { block: false });
      fair.taken(job?.id, false);
      expect(job?.id).toBe('a0');
      const a0 = whole('alpha', { maxTokens: 300 });
      fair.released('a0', a0);
      expect(virtual(fair, 'alpha')).toBe(100 + 2 * 300);
      // Its client left before it ran (job-runner.ts, `skip`): alpha got nothing for it.
      fair.notRun('a0', a0);
      fair.ended(a0);
      expect(fair.view()['alpha']).toMatchObject({ virtualTokens: 0, inflight: 0 });
      // A tie again, which goes to the tenant configured first.
      expect(await releaseNext(fair, 1)).toBe('alpha:a1');
    });

    it("reserves the pool's mean output per sequence for a job without a limit", async () => {
      const fair = fairShare();
      await fair.load();
      const open = whole('alpha', { sequences: 2 });
      expect(fair.expectedOutput(open)).toBe(2 * DEFAULT_OUTPUT_PER_SEQUENCE);
      fair.released('a0', open);
      expect(virtual(fair, 'alpha')).toBe(100 + 2 * 2 * DEFAULT_OUTPUT_PER_SEQUENCE);
      // Its usage: 2 x 64 tokens. The mean moves 1/32 of the way from 256 to 64 per sequence.
      fair.outputEnded('a0', open, 128, false);
      expect(virtual(fair, 'alpha')).toBe(100 + 2 * 128);
      const mean = DEFAULT_OUTPUT_PER_SEQUENCE + (64 - DEFAULT_OUTPUT_PER_SEQUENCE) / 32;
      expect(fair.expectedOutput(whole('beta'))).toBe(Math.round(mean));
      // A limited answer says nothing of an unlimited one's length, nor does one without usage.
      const limited = whole('alpha', { maxTokens: 4 });
      fair.released('a1', limited);
      fair.outputEnded('a1', limited, 4, false);
      fair.released('a2', open);
      fair.outputEnded('a2', open, undefined, false);
      expect(fair.expectedOutput(whole('beta'))).toBe(Math.round(mean));
      expect(fair.expectedOutput(limited)).toBe(4);
    });
  });

  it('ignores counters of tenants no longer configured, and values that are not numbers', async () => {
    await redis.hset(keys.fairShare('p'), { gone: '5', alpha: 'NaN', beta: '7' });
    const fair = fairShare();
    await fair.load();
    expect(Object.keys(fair.view())).toEqual(['alpha', 'beta']);
    expect(fair.view()['alpha']!.virtualTokens).toBe(0);
    expect(fair.view()['beta']!.virtualTokens).toBe(7);
  });
});
