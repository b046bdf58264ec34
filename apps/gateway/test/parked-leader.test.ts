// Parked jobs of a pool that lost its last dispatcher, against a real redis-server, BullMQ and
// real sockets: the parked check takes them back from the queue and answers their clients
// no_leader, as a new request is answered, instead of holding them to their park limit for
// a queue nobody releases. A lease changing hands, a job a leader took, and a running job
// are left alone. The leader check runs on a clock of the test's own (PoolQueue's `now`).
import { once } from 'node:events';
import { createServer, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { defaultDegradation, type PoolConfig } from '@sluice/config';
import { keySpace, type Frame, type JobPayload } from '@sluice/protocol';
import { createRedis, redisReady, type Redis } from '@sluice/redis';
import { startRedis, type TestRedis } from '@sluice/test/support';
import { Worker } from 'bullmq';
import type { FastifyBaseLogger } from 'fastify';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { HeldClients } from '../src/held-clients.ts';
import { HeldRequest, type HeldRequestHooks } from '../src/held-request.ts';
import { ParkedWatch } from '../src/parked-watch.ts';
import { HANDOVER_GRACE_MS, PoolQueue } from '../src/pool-queue.ts';
import { refusal } from '../src/refuse.ts';
import { ReplyRouter } from '../src/replies.ts';

let server: TestRedis;
let redis: Redis;
let bull: Redis;
let subscriber: Redis;
let queue: PoolQueue;
let http: Server;
let port: number;
let clock = 0;
/** The next request's response, handed to the test by the HTTP server. */
let nextResponse: ((res: ServerResponse) => void) | undefined;
const keys = keySpace('sluice');
const lease = keys.lease('p');

const pool: PoolConfig = {
  name: 'p',
  models: ['m'],
  engines: [
    { name: 'e', url: 'http://127.0.0.1:1', maxInflight: 1, capSource: 'config', lane: 'any' },
  ],
  queueDepth: 10,
  maxParkSeconds: 60,
  degradation: defaultDegradation,
  longPrompts: {
    thresholdTokens: 8192,
    maxShare: 0.5,
    maxInPrefill: 1,
    agingSeconds: 60,
    kvFit: true,
  },
};

const payload: JobPayload = {
  v: 1,
  body: '{}',
  path: '/v1/chat/completions',
  stream: true,
  replica: 'gw',
  enqueuedAt: 0,
  deadline: 1,
  priority: 0,
};

beforeAll(async () => {
  server = await startRedis();
  redis = createRedis(server.url, { name: 'cmd', role: 'command' });
  bull = createRedis(server.url, { name: 'bull', role: 'bullmq' });
  subscriber = createRedis(server.url, { name: 'sub', role: 'subscriber' });
  await Promise.all([redisReady(redis), redisReady(bull), redisReady(subscriber)]);
  http = createServer((_req, res) => {
    // One request per connection: a kept-alive socket closed between tests would swallow the next.
    res.shouldKeepAlive = false;
    nextResponse?.(res);
  });
  http.listen(0, '127.0.0.1');
  await once(http, 'listening');
  port = (http.address() as AddressInfo).port;
});
beforeEach(async () => {
  await redis.flushall();
  clock = 1_000_000;
  queue = new PoolQueue(pool, keys, redis, bull, 10, () => clock);
});
afterEach(async () => {
  http.closeAllConnections();
  await queue.close();
});
afterAll(async () => {
  http.close();
  await Promise.all([redis.quit(), bull.quit(), subscriber.quit()]);
  await server.stop();
});

interface Recorded {
  cancels: [string, string][];
  refused: string[];
}

function hooks(overrides: Partial<HeldRequestHooks> = {}): HeldRequestHooks & Recorded {
  const recorded: Recorded = { cancels: [], refused: [] };
  return {
    ...recorded,
    heartbeatMs: 60_000,
    maxParkMs: 60_000,
    slowClientBytes: 1024 ** 3,
    slowClientStallMs: 60_000,
    engineDetails: true,
    now: Date.now,
    removeQueued: (jobId) => queue.removeQueued(jobId),
    jobKey: (jobId) => queue.jobKey(jobId),
    cancel: (jobId, reason) => recorded.cancels.push([jobId, reason]),
    retryAfter: async () => 7,
    onHeartbeat: () => {},
    onStarted: () => {},
    onFirstByte: () => {},
    onRefused: (_held, r) => recorded.refused.push(r.reason),
    onDone: () => {},
    ...overrides,
  };
}

/** A client whose job is queued in `queue` (the add resolved), held by a HeldRequest. */
async function parked(jobId: string, h: HeldRequestHooks, stream = true) {
  const served = new Promise<ServerResponse>((resolve) => (nextResponse = resolve));
  const answer = fetch(`http://127.0.0.1:${port}/`, { method: 'POST', body: '{}' });
  // A client left waiting when the test ends is cut then (afterEach).
  answer.catch(() => undefined);
  const request = new HeldRequest(jobId, 'm', stream, Date.now(), Date.now(), await served, h);
  expect(await queue.add(jobId, { ...payload, stream }, 'short')).toBeUndefined();
  request.added = true;
  request.hold();
  return { request, answer };
}

/** A frame without its job id and sequence number (distributed over the union). */
type FrameBody = Frame extends infer F
  ? F extends Frame
    ? Omit<F, 'jobId' | 'seq'>
    : never
  : never;

function frame(jobId: string, body: FrameBody, seq: number): Frame {
  return { ...body, jobId, seq } as Frame;
}

const start = { type: 'start', info: { engine: 'e', loadState: 'normal' } } as const;

/** A dispatcher taking the next queued job under its lock, as the release loop does. */
async function take(): Promise<{ id: string | undefined; worker: Worker }> {
  const worker = new Worker(keys.queueName('p'), null, {
    connection: bull,
    prefix: keys.prefix,
    autorun: false,
  });
  const job = await worker.getNextJob('tok', { block: false });
  return { id: job?.id, worker };
}

/** A watch that answers as HeldClients does (held-clients.ts), recording what it answered. */
function watch(helds: HeldRequest[]) {
  const answered: string[] = [];
  const errors: unknown[] = [];
  const w = new ParkedWatch(redis, () => helds, {
    intervalMs: 60_000,
    listening: () => true,
    onLost: (held) => answered.push(`${held.jobId}: lost`),
    leaders: {
      poolOf: () => queue,
      onLeaderless: (held, _pool, retryAfter) => {
        answered.push(`${held.jobId}: no_leader`);
        held.fail(refusal('no_leader', 'no dispatcher is leading pool p', retryAfter));
      },
    },
    onError: (err) => errors.push(err),
  });
  return { watch: w, answered, errors };
}

describe('parked jobs of a pool without a leader', () => {
  it('a lease missing past the hand-over grace: parked jobs leave the queue and their clients get 503 no_leader (in-band on a stream already started); a running job goes on', async () => {
    await redis.set(lease, 'd1', 'PX', 60_000);
    expect(await queue.hasLeader()).toBe(true);
    // A running job: taken by the dispatcher under its lock, its start frame received.
    const running = await parked('running', hooks());
    expect((await take()).id).toBe('running');
    running.request.onFrame(frame('running', start, 0));
    expect(running.request.state).toBe('running');
    const plain = await parked('plain', hooks(), false);
    // A stream whose head went out with its first keep-alive.
    const streamHooks = hooks({ heartbeatMs: 1 });
    const stream = await parked('stream', streamHooks);
    const streamRes = await stream.answer;
    expect(streamRes.status).toBe(200);

    const { watch: w, answered, errors } = watch([running.request, plain.request, stream.request]);
    // The leader's SIGTERM deletes the key: a hand-over, for the grace, takes nothing back.
    await redis.del(lease);
    clock += 1000;
    await w.check();
    expect(answered).toEqual([]);
    expect(await redis.exists(queue.jobKey('plain'), queue.jobKey('stream'))).toBe(2);
    // Still missing when the grace has run out: nobody will release them.
    clock += HANDOVER_GRACE_MS;
    await w.check();
    expect(answered.sort()).toEqual(['plain: no_leader', 'stream: no_leader']);
    expect(errors).toEqual([]);

    const plainRes = await plain.answer;
    expect(plainRes.status).toBe(503);
    expect(plainRes.headers.get('x-sluice-reject-reason')).toBe('no_leader');
    expect(Number(plainRes.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);
    const events = await streamRes.text();
    expect(events).toMatch(
      /data: \{"error":\{"message":"no dispatcher is leading pool p","type":"server_error","param":null,"code":"no_leader"\}\}\n\ndata: \[DONE\]\n\n$/,
    );
    // Taken back (not cancelled: they never ran), and gone from the queue.
    expect(await redis.exists(queue.jobKey('plain'), queue.jobKey('stream'))).toBe(0);
    expect(await queue.queue.count()).toBe(0);
    // The running job is the dispatcher's still.
    expect(running.request.state).toBe('running');
    expect(await redis.exists(queue.jobKey('running'))).toBe(1);
    expect(streamHooks.cancels).toEqual([]);
  });

  it('a lease that changes hands within the grace takes nothing back', async () => {
    await redis.set(lease, 'd1', 'PX', 60_000);
    expect(await queue.hasLeader()).toBe(true);
    const h = hooks();
    const { request } = await parked('j', h);
    const { watch: w, answered } = watch([request]);
    await redis.del(lease);
    clock += 1000;
    await w.check();
    // The standby leads before the grace ends; the next reads find it.
    await redis.set(lease, 'd2', 'PX', 60_000);
    clock += HANDOVER_GRACE_MS;
    await w.check();
    clock += 10 * HANDOVER_GRACE_MS;
    await w.check();
    expect(answered).toEqual([]);
    expect(request.parked).toBe(true);
    expect(await redis.exists(queue.jobKey('j'))).toBe(1);
  });

  it('a job a leader took at that moment runs: its client is not answered no_leader', async () => {
    const h = hooks({ heartbeatMs: 1 });
    const { request, answer } = await parked('j', h);
    const res = await answer;
    // The lease is missing (never seen: "none" at once), and a new leader takes the job in
    // the gap between that read and the removal: its start frame is not here yet.
    expect(await queue.hasLeader()).toBe(false);
    const { id, worker } = await take();
    expect(id).toBe('j');
    const { watch: w, answered } = watch([request]);
    await w.check();
    expect(answered).toEqual([]);
    expect(request.parked).toBe(true);
    expect(h.refused).toEqual([]);
    // It runs, and its client reads the answer.
    request.onFrame(frame('j', start, 0));
    request.onFrame(frame('j', { type: 'head', info: { status: 200, contentType: 'x' } }, 1));
    request.onFrame(frame('j', { type: 'data', chunk: Buffer.from('data: {"a":1}\n\n') }, 2));
    request.onFrame(frame('j', { type: 'end' }, 3));
    expect(await res.text()).toMatch(/data: \{"a":1\}\n\n$/);
    expect(h.refused).toEqual([]);
    await worker.close();
  });

  it("withdrawing a job frees its tenant's place and its body key, read from the job itself", async () => {
    const tenantKey = keys.tenantQueued('p', 'alpha');
    const body = keys.jobBody('p', 'big');
    const added = await queue.add(
      'big',
      {
        ...payload,
        body: undefined,
        bodyInKey: true,
        tenant: 'alpha',
        deadline: Date.now() + 60_000,
      },
      'short',
      { name: 'alpha', maxQueued: 5 },
      Buffer.from('{"x":1}'),
    );
    expect(added).toBeUndefined();
    expect(await redis.zcard(tenantKey)).toBe(1);
    expect(await redis.exists(body)).toBe(1);
    expect(await queue.withdrawQueued('big')).toBe('removed');
    expect(await redis.zcard(tenantKey)).toBe(0);
    expect(await redis.exists(body, queue.jobKey('big'))).toBe(0);
    expect(await queue.withdrawQueued('big')).toBe('missing');
  });
});

describe('HeldClients', () => {
  it('answers a parked client of a pool without a leader 503 no_leader, not park_timeout at its limit', async () => {
    const replies = new ReplyRouter(
      subscriber,
      'replies',
      60_000,
      Date.now,
      () => {},
      () => {},
    );
    const warnings: string[] = [];
    const log = {
      warn: (_o: object, msg: string) => warnings.push(msg),
      info: () => {},
    } as unknown as FastifyBaseLogger;
    const held = new HeldClients({
      replies,
      passthrough: { size: 0, whenIdle: async () => {}, cutAll: () => 0 },
      pools: new Map([['p', queue]]),
      redis,
      subscriber,
      redisLossGraceMs: 60_000,
      drainMs: 0,
      log,
      parkedCheckMs: 20,
    });
    // Its park limit would answer park_timeout: the check must come first.
    const h = hooks({ maxParkMs: 10_000 });
    const { request, answer } = await parked('j', h, false);
    replies.held.set('j', request);
    try {
      const res = await answer;
      expect(res.headers.get('x-sluice-reject-reason')).toBe('no_leader');
      expect(res.status).toBe(503);
      const refused = (await res.json()) as { error: { message: string } };
      expect(refused.error.message).toBe('no dispatcher is leading pool p');
      expect(await redis.exists(queue.jobKey('j'))).toBe(0);
      expect(warnings).toContain('no dispatcher leads the pool: parked job taken back');
    } finally {
      held.stop();
      replies.stop();
    }
  });
});
