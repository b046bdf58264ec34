// The gateway's side of a pool against a real redis-server and BullMQ.
import { defaultDegradation, type PoolConfig } from '@sluice/config';
import { BODY_KEY_GRACE_MS, keySpace, type JobPayload } from '@sluice/protocol';
import { createRedis, redisReady, type Redis } from '@sluice/redis';
import { startRedis, type TestRedis } from '@sluice/test/support';
import { Worker } from 'bullmq';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { TENANT_STALE_CHECKS } from '../src/admission.ts';
import { PoolQueue } from '../src/pool-queue.ts';

let server: TestRedis;
let redis: Redis;
let bull: Redis;
let queue: PoolQueue;
const keys = keySpace('sluice');
const pool: PoolConfig = {
  name: 'p',
  models: ['m'],
  engines: [
    { name: 'e', url: 'http://127.0.0.1:1', maxInflight: 1, capSource: 'config', lane: 'any' },
  ],
  queueDepth: 3,
  maxParkSeconds: 10,
  degradation: defaultDegradation,
  longPrompts: {
    thresholdTokens: 8192,
    maxShare: 0.5,
    maxInPrefill: 1,
    agingSeconds: 60,
    kvFit: true,
  },
};

const payload = (priority = 0): JobPayload => ({
  v: 1,
  body: '{}',
  path: '/v1/completions',
  stream: false,
  replica: 'gw',
  enqueuedAt: 0,
  deadline: 1,
  priority,
});

beforeAll(async () => {
  server = await startRedis();
  redis = createRedis(server.url, { name: 'cmd', role: 'command' });
  bull = createRedis(server.url, { name: 'bull', role: 'bullmq' });
  await Promise.all([redisReady(redis), redisReady(bull)]);
  queue = new PoolQueue(pool, keys, redis, bull, 10, Date.now);
});
beforeEach(() => redis.flushall());
afterAll(async () => {
  await queue.close();
  await Promise.all([redis.quit(), bull.quit()]);
  await server.stop();
});

describe('pool queue (gateway side)', () => {
  it('refuses the jobs that would exceed the depth bound, even when many arrive at once', async () => {
    const results = await Promise.all(
      Array.from({ length: 10 }, (_, i) => queue.add(`j${i}`, payload(i % 3), 'short')),
    );
    expect(results.filter((r) => r === undefined)).toHaveLength(3);
    expect(await queue.queue.count()).toBe(3);
  });

  it('a refused add leaves nothing behind: no job, no placeholder', async () => {
    for (let i = 0; i < 3; i += 1)
      expect(await queue.add(`k${i}`, payload(), 'short')).toBeUndefined();
    expect(await queue.add('refused', payload(), 'short')).toBe('queue_full');
    expect(await queue.queue.getJob('refused')).toBeUndefined();
    expect(await redis.exists(keys.jobKey('p', 'refused'))).toBe(0);
    expect(await queue.queue.count()).toBe(3);
  });

  it("admits with one script call, and a refusal runs none of BullMQ's add", async () => {
    const calls = async () => {
      const stats = await redis.info('commandstats');
      const count = (name: string) =>
        Number(new RegExp(`cmdstat_${name}:calls=(\\d+)`).exec(stats)?.[1] ?? 0);
      return {
        multi: count('multi'),
        exec: count('exec'),
        script: count('evalsha') + count('eval'),
        xadd: count('xadd'),
      };
    };
    // The first add may send the script's text (EVAL) before its sha is known.
    expect(await queue.add('warm', payload(), 'short')).toBeUndefined();
    const before = await calls();
    for (let i = 0; i < 2; i += 1)
      expect(await queue.add(`one${i}`, payload(), 'short')).toBeUndefined();
    expect(await queue.add('refused', payload(), 'short')).toBe('queue_full');
    const after = await calls();
    // Two admissions and a refusal: three scripts, no transaction around them.
    expect(after).toEqual({
      multi: before.multi,
      exec: before.exec,
      script: before.script + 3,
      xadd: before.xadd,
    });
    // BullMQ's add runs without its events stream and its id counter (withoutEventsStream).
    expect(after.xadd).toBe(before.xadd);
    const queueKey = `${keys.prefix}:${keys.queueName('p')}`;
    expect(await redis.exists(`${queueKey}:events`, `${queueKey}:id`)).toBe(0);
    expect(await queue.queue.getJobCountByTypes('prioritized', 'wait')).toBe(3);
  });

  it('puts a large body into a key of its own in the same script, expiring; none after a refusal', async () => {
    const bytes = Buffer.from('{"messages":[{"content":"caf\u00e9 \\"q\\" \u4e2d \u00ff"}]}');
    const raw: JobPayload = {
      ...payload(),
      body: undefined,
      bodyInKey: true,
      deadline: Date.now() + 10_000,
    };
    for (let i = 0; i < 3; i += 1)
      expect(await queue.add(`r${i}`, raw, 'short', undefined, bytes)).toBeUndefined();
    expect(await redis.getBuffer(keys.jobBody('p', 'r0'))).toEqual(bytes);
    // It expires after the park limit and the grace, should no dispatcher take it.
    const ttl = await redis.pttl(keys.jobBody('p', 'r0'));
    expect(ttl).toBeGreaterThan(BODY_KEY_GRACE_MS);
    expect(ttl).toBeLessThanOrEqual(10_000 + BODY_KEY_GRACE_MS);
    // BullMQ's job data holds no body.
    expect((await queue.queue.getJob('r0'))?.data).toEqual({ ...raw, body: undefined });
    expect(await queue.add('r-refused', raw, 'short', undefined, bytes)).toBe('queue_full');
    expect(await redis.exists(keys.jobKey('p', 'r-refused'), keys.jobBody('p', 'r-refused'))).toBe(
      0,
    );
    await expect(queue.add('r-none', raw, 'short')).rejects.toThrow(/none was given/);
    // Taken back while queued, its body goes with it.
    expect(await queue.removeQueued('r1', { bodyInKey: true })).toBe('removed');
    expect(await redis.exists(keys.jobBody('p', 'r1'))).toBe(0);
    expect(await redis.exists(keys.jobBody('p', 'r2'))).toBe(1);
  });

  it('holds the bound after Redis has lost its scripts', async () => {
    // One add first, so this connection has sent every script once before Redis forgets them.
    expect(await queue.add('before', payload(), 'short')).toBeUndefined();
    await redis.script('FLUSH');
    const results = await Promise.all(
      Array.from({ length: 8 }, (_, i) => queue.add(`f${i}`, payload(), 'short')),
    );
    expect(results.filter((r) => r === undefined)).toHaveLength(2);
    expect(await queue.queue.count()).toBe(3);
    const admitted = results.flatMap((r, i) => (r === undefined ? [`f${i}`] : []));
    for (const id of admitted) expect(await queue.queue.getJob(id)).toBeDefined();
  });

  it('removes a queued job, but not one a dispatcher has taken, and tells a vanished one apart', async () => {
    await queue.add('a', payload(), 'short');
    await queue.add('b', payload(), 'short');
    const worker = new Worker(keys.queueName('p'), null, {
      connection: bull,
      prefix: keys.prefix,
      autorun: false,
    });
    const taken = await worker.getNextJob('tok', { block: false });
    expect(taken?.id).toBe('a');
    expect(await queue.removeQueued('a')).toBe('taken');
    expect(await queue.removeQueued('b')).toBe('removed');
    expect(await queue.queue.count()).toBe(0);
    // BullMQ's removeJob answers 1 for a job that does not exist; the gateway does not.
    expect(await queue.queue.remove('never-added')).toBe(1);
    expect(await queue.removeQueued('never-added')).toBe('missing');
    expect(await queue.removeQueued('b')).toBe('missing');
    await worker.close();
  });

  it('serves higher priority first and FIFO within a priority', async () => {
    const deep = new PoolQueue({ ...pool, queueDepth: 100 }, keys, redis, bull, 10, Date.now);
    for (const [id, priority] of [
      ['low1', 0],
      ['high', 10],
      ['low2', 0],
      ['mid', 5],
    ] as const)
      expect(await deep.add(id, payload(priority), 'short')).toBeUndefined();
    await deep.close();
    const worker = new Worker(keys.queueName('p'), null, {
      connection: bull,
      prefix: keys.prefix,
      autorun: false,
    });
    const order = [];
    for (let i = 0; i < 4; i += 1)
      order.push((await worker.getNextJob(`t${i}`, { block: false }))?.id);
    expect(order).toEqual(['high', 'mid', 'low1', 'low2']);
    await worker.close();
  });

  it('within a priority class serves aged long prompts, then short ones, then long ones, FIFO in each', async () => {
    const deep = new PoolQueue({ ...pool, queueDepth: 100 }, keys, redis, bull, 10, Date.now);
    for (const [id, priority, level] of [
      ['long1', 0, 'long'],
      ['short1', 0, 'short'],
      ['aged', 0, 'aged'],
      ['long2', 0, 'long'],
      ['short2', 0, 'short'],
      ['highLong', 5, 'long'],
    ] as const)
      expect(await deep.add(id, payload(priority), level)).toBeUndefined();
    await deep.close();
    const worker = new Worker(keys.queueName('p'), null, {
      connection: bull,
      prefix: keys.prefix,
      autorun: false,
    });
    const order = [];
    for (let i = 0; i < 6; i += 1)
      order.push((await worker.getNextJob(`t${i}`, { block: false }))?.id);
    expect(order).toEqual(['highLong', 'aged', 'short1', 'short2', 'long1', 'long2']);
    await worker.close();
  });

  it('counts the jobs a dispatcher holds back (the delayed set) against the depth bound', async () => {
    expect(await queue.add('held', payload(), 'long')).toBeUndefined();
    const worker = new Worker(keys.queueName('p'), null, {
      connection: bull,
      prefix: keys.prefix,
      autorun: false,
    });
    const taken = await worker.getNextJob('tok', { block: false });
    await taken!.moveToDelayed(Date.now() + 60_000, 'tok');
    expect(await queue.add('a', payload(), 'short')).toBeUndefined();
    expect(await queue.add('b', payload(), 'short')).toBeUndefined();
    expect(await queue.add('c', payload(), 'short')).toBe('queue_full');
    // Its client gone, the gateway still removes a held job.
    expect(await queue.removeQueued('held')).toBe('removed');
    expect(await queue.add('c', payload(), 'short')).toBeUndefined();
    await worker.close();
  });

  it('holds the bound across replicas adding at the same moment', async () => {
    const replicas = [0, 1, 2].map(() => new PoolQueue(pool, keys, redis, bull, 10, Date.now));
    const results = await Promise.all(
      Array.from({ length: 12 }, (_, i) => replicas[i % 3]!.add(`x${i}`, payload(), 'short')),
    );
    expect(results.filter((r) => r === undefined)).toHaveLength(3);
    expect(await queue.queue.count()).toBe(3);
    await Promise.all(replicas.map((r) => r.close()));
  });

  it("bounds each tenant's queued jobs exactly, across replicas, apart from the pool's bound", async () => {
    const wide = new PoolQueue({ ...pool, queueDepth: 100 }, keys, redis, bull, 10, Date.now);
    const other = new PoolQueue({ ...pool, queueDepth: 100 }, keys, redis, bull, 10, Date.now);
    const alpha = { name: 'alpha', maxQueued: 4 };
    const results = await Promise.all(
      Array.from({ length: 12 }, (_, i) =>
        (i % 2 ? wide : other).add(`a${i}`, payload(), 'short', alpha),
      ),
    );
    expect(results.filter((r) => r === undefined)).toHaveLength(4);
    expect(results.filter((r) => r === 'tenant_queue_full')).toHaveLength(8);
    // Another tenant, and one without a bound of its own, still get in.
    expect(
      await wide.add('b0', payload(), 'short', { name: 'beta', maxQueued: 4 }),
    ).toBeUndefined();
    expect(await wide.add('c0', payload(), 'short', { name: 'gamma' })).toBeUndefined();
    expect(await redis.zcard(keys.tenantQueued('p', 'alpha'))).toBe(4);
    expect(await redis.zcard(keys.tenantQueued('p', 'beta'))).toBe(1);
    expect(await wide.queue.count()).toBe(6);
    // A job taken back by its gateway frees its tenant's place at once.
    const admitted = results.flatMap((r, i) => (r === undefined ? [`a${i}`] : []));
    expect(await wide.removeQueued(admitted[0]!, { tenant: 'alpha' })).toBe('removed');
    expect(await wide.add('a-next', payload(), 'short', alpha)).toBeUndefined();
    expect(await wide.add('a-over', payload(), 'short', alpha)).toBe('tenant_queue_full');
    await Promise.all([wide.close(), other.close()]);
  });

  it("drops a tenant's members whose job is gone before refusing", async () => {
    const wide = new PoolQueue({ ...pool, queueDepth: 100 }, keys, redis, bull, 10, Date.now);
    const alpha = { name: 'alpha', maxQueued: 2 };
    expect(await wide.add('g1', payload(), 'short', alpha)).toBeUndefined();
    expect(await wide.add('g2', payload(), 'short', alpha)).toBeUndefined();
    // Ended without anyone removing its member (a dispatcher that died, a Redis blip).
    await wide.queue.remove('g1');
    expect(await wide.add('g3', payload(), 'short', alpha)).toBeUndefined();
    expect(await redis.zrange(keys.tenantQueued('p', 'alpha'), 0, -1)).toEqual(['g2', 'g3']);
    await wide.close();
  });

  it('refuses a tenant at its bound with a check of a few members whatever its number, and still drops a gone one at the front', async () => {
    const wide = new PoolQueue({ ...pool, queueDepth: 100_000 }, keys, redis, bull, 10, Date.now);
    const existsCalls = async () =>
      Number(/cmdstat_exists:calls=(\d+)/.exec(await redis.info('commandstats'))?.[1] ?? 0);
    // A tenant with 2,000 jobs queued, at its bound: its set's members and their jobs' hashes,
    // which is all the admission script reads of them.
    const size = 2000;
    const alpha = { name: 'alpha', maxQueued: size };
    const tenantKey = keys.tenantQueued('p', 'alpha');
    const ids = Array.from({ length: size }, (_, i) => `q${String(i).padStart(5, '0')}`);
    const fill = redis.pipeline();
    for (const id of ids) {
      fill.zadd(tenantKey, 32, id);
      fill.hset(keys.jobKey('p', id), 'data', '{}');
    }
    await fill.exec();
    // A client retrying its 429s in a loop.
    for (let i = 0; i < 3; i += 1) {
      const before = await existsCalls();
      expect(await wide.add(`over${i}`, payload(), 'short', alpha)).toBe('tenant_queue_full');
      expect((await existsCalls()) - before).toBeLessThanOrEqual(TENANT_STALE_CHECKS);
    }
    // The job at the front ended without its member being removed: the tenant is not refused
    // for it, and the bound still holds for the live ones.
    await redis.del(keys.jobKey('p', ids[0]!));
    const before = await existsCalls();
    expect(await wide.add('next', payload(), 'short', alpha)).toBeUndefined();
    expect((await existsCalls()) - before).toBeLessThanOrEqual(TENANT_STALE_CHECKS);
    expect(await redis.zscore(tenantKey, ids[0]!)).toBeNull();
    expect(await redis.zcard(tenantKey)).toBe(size);
    expect(await wide.add('over-again', payload(), 'short', alpha)).toBe('tenant_queue_full');
    await wide.close();
  });

  it('refuses every add while the pool drains, tenants included, and only then', async () => {
    expect(await queue.add('before', payload(), 'short')).toBeUndefined();
    await redis.set(keys.poolControl('p'), 'draining');
    expect(await queue.add('d1', payload(), 'short')).toBe('pool_draining');
    expect(await queue.add('d2', payload(), 'short', { name: 'alpha', maxQueued: 4 })).toBe(
      'pool_draining',
    );
    // Nothing of the refused adds is left: no job, no placeholder, no tenant member.
    expect(await redis.exists(keys.jobKey('p', 'd1'), keys.jobKey('p', 'd2'))).toBe(0);
    expect(await redis.exists(keys.tenantQueued('p', 'alpha'))).toBe(0);
    expect(await queue.queue.count()).toBe(1);
    // Paused still queues; a resume (the key deleted) opens again.
    await redis.set(keys.poolControl('p'), 'paused');
    expect(await queue.add('p1', payload(), 'short')).toBeUndefined();
    await redis.del(keys.poolControl('p'));
    expect(await queue.add('o1', payload(), 'short')).toBeUndefined();
    expect(await queue.queue.count()).toBe(3);
  });

  it('knows whether a dispatcher leads the pool', async () => {
    const fresh = new PoolQueue(pool, keys, redis, bull, 10, Date.now);
    expect(await fresh.hasLeader()).toBe(false);
    await redis.set(keys.lease('p'), 'd1');
    const later = new PoolQueue(pool, keys, redis, bull, 10, Date.now);
    expect(await later.hasLeader()).toBe(true);
    await Promise.all([fresh.close(), later.close()]);
  });

  it('estimates Retry-After from the drain rate the leader published', async () => {
    await redis.set(
      keys.poolStats('p'),
      JSON.stringify({ leader: 'd', at: 0, drainPerSecond: 0.5, engines: [] }),
    );
    for (let i = 0; i < 3; i += 1) await queue.add(`r${i}`, payload(), 'short');
    await queue.add('over', payload(), 'short');
    // 3 queued ahead + this one, at 0.5 per second: 8 s.
    expect(await queue.retryAfter()).toBe(8);
  });

  it("estimates a long prompt's wait from the long prompts ahead and the measured prefill rate", async () => {
    const stats = (longs: object) =>
      JSON.stringify({ leader: 'd', at: 0, drainPerSecond: 1, engines: [], longs });
    await redis.set(
      keys.poolStats('p'),
      stats({
        held: 2,
        heldTokens: 80_000,
        inPrefill: 1,
        prefillRemainingTokens: 20_000,
        parallelPrefills: 2,
      }),
    );
    const fresh = () => new PoolQueue(pool, keys, redis, bull, 10, Date.now);
    // No rate measured yet: no estimate, the request is parked as usual.
    expect(await fresh().longWait()).toBeUndefined();
    await redis.set(
      keys.poolStats('p'),
      stats({
        held: 2,
        heldTokens: 80_000,
        inPrefill: 1,
        prefillRemainingTokens: 20_000,
        prefillTokensPerSecond: 500,
        parallelPrefills: 2,
      }),
    );
    // 100,000 tokens ahead at 2 x 500 tokens per second.
    expect(await fresh().longWait()).toBe(100);
  });
});
