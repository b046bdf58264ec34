// The completion route between its awaits: a client that leaves while the route awaits Redis,
// and an add whose answer comes late. A real redis-server behind PoolQueue, a real Fastify app
// with the route, and the add or leader check held at a gate so the test decides what happens
// meanwhile. A dispatcher's take is BullMQ's own (a Worker's getNextJob).
import { once } from 'node:events';
import type { Socket } from 'node:net';
import { connect } from 'node:net';
import { loadConfig, type SluiceConfig } from '@sluice/config';
import { gatewayMetrics, Registry } from '@sluice/observability';
import { keySpace, validateJobPayload, type JobPayload, type QueueLevel } from '@sluice/protocol';
import { createRedis, redisReady, type Redis } from '@sluice/redis';
import {
  eventually,
  jsonLines,
  queuedJobs,
  startRedis,
  type TestRedis,
} from '@sluice/test/support';
import { Worker } from 'bullmq';
import Fastify, { type FastifyInstance } from 'fastify';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import type { RequestEnd } from '../src/access-log.ts';
import { installAuth } from '../src/auth.ts';
import { heldHooks } from '../src/held-hooks.ts';
import type { Passthrough } from '../src/passthrough.ts';
import { PoolQueue } from '../src/pool-queue.ts';
import { refusalBody, refusalHeaders } from '../src/refuse.ts';
import { ReplyRouter } from '../src/replies.ts';
import { installRequestId, REQUEST_ID_HEADER, requestId } from '../src/request-id.ts';
import { Routing } from '../src/routing.ts';
import { acceptRawJson, completionRoutes } from '../src/routes/completions.ts';

const keys = keySpace('sluice');
const ENQUEUE_TIMEOUT_MS = 200;

let server: TestRedis;
let redis: Redis;
let bull: Redis;
let config: SluiceConfig;
let queue: PoolQueue;
let replies: ReplyRouter;

beforeAll(async () => {
  server = await startRedis();
  redis = createRedis(server.url, { name: 'cmd', role: 'command' });
  bull = createRedis(server.url, { name: 'bull', role: 'bullmq' });
  await Promise.all([redisReady(redis), redisReady(bull)]);
  config = loadConfig({ VLLM_URL: 'http://127.0.0.1:1', VLLM_MODEL: 'm', REDIS_URL: server.url });
  // Never started: the tests hand frames to the held request themselves.
  replies = new ReplyRouter(
    redis,
    'replies',
    60_000,
    Date.now,
    () => {},
    () => {},
  );
});
afterAll(async () => {
  replies.stop();
  await Promise.all([redis.quit(), bull.quit()]);
  await server.stop();
});

let app: FastifyInstance;
let logLines: Record<string, unknown>[];
let ended: RequestEnd[];
let cancels: [string, string][];
let whenEnded: (() => void) | undefined;

beforeEach(async () => {
  await redis.flushall();
  const pool = config.pools[0]!;
  // A leader holds the pool's lease: the leader check lets requests through.
  await redis.set(keys.lease(pool.name), 'dispatcher');
  queue = new PoolQueue(pool, keys, redis, bull, config.limits.maxPriority, Date.now);
  const log = jsonLines();
  logLines = log.lines;
  ended = [];
  cancels = [];
  whenEnded = undefined;
  const metrics = gatewayMetrics(new Registry());
  const recordEnd = (end: RequestEnd) => {
    ended.push(end);
    whenEnded?.();
  };
  app = Fastify({
    logger: { level: 'warn', stream: log.stream },
    // As main.ts: the client's x-request-id when safe, else a UUID.
    genReqId: (req) => requestId(req.headers[REQUEST_ID_HEADER]),
  });
  acceptRawJson(app);
  installRequestId(app, Date.now);
  installAuth(app, undefined, (reply) => reply);
  await app.register(completionRoutes, {
    replicaId: 'gw',
    limits: config.limits,
    routing: new Routing(config),
    pools: new Map([[pool.name, queue]]),
    redisUp: () => true,
    replies,
    passthrough: {} as Passthrough,
    metrics,
    now: Date.now,
    heldHooks: (p, info) =>
      heldHooks(
        {
          heartbeatSeconds: 60,
          slowClientBytes: 1024 ** 3,
          slowClientStallSeconds: 60,
          engineDetails: true,
          now: Date.now,
          metrics,
          replies,
          publishCancel: (jobId, reason) => cancels.push([jobId, reason]),
          ended: recordEnd,
        },
        p,
        info,
      ),
    admit: () => undefined,
    refuse: (reply, _model, r) =>
      reply.code(r.status).headers(refusalHeaders(r)).send(refusalBody(r)),
    ended: recordEnd,
    enqueueTimeoutMs: ENQUEUE_TIMEOUT_MS,
  });
  await app.listen({ port: 0, host: '127.0.0.1' });
});
afterEach(async () => {
  await app.close();
  await queue.close();
});

/** Resolves with the next end the access log records. */
function nextEnd(): Promise<RequestEnd> {
  return new Promise((resolve) => (whenEnded = () => resolve(ended.at(-1)!)));
}

/** A gate a wrapped PoolQueue method waits at: `reached` once called, released by `open`. */
function gate() {
  let reach!: () => void;
  let open!: () => void;
  const reached = new Promise<void>((resolve) => (reach = resolve));
  const opened = new Promise<void>((resolve) => (open = resolve));
  return { reached, open, pass: () => (reach(), opened) };
}

const body = JSON.stringify({
  model: 'm',
  stream: true,
  messages: [{ role: 'user', content: 'hi' }],
});

const port = () => (app.server.address() as { port: number }).port;

function post(): Promise<Response> {
  return fetch(`http://127.0.0.1:${port()}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body,
  });
}

/** The one request held now, as the reply router knows it. */
function heldNow() {
  const [held] = replies.held.values();
  if (!held) throw new Error('no request is held');
  return held;
}

describe('completion route', () => {
  it("estimates the prompt from the endpoint's own field, as vLLM reads it", async () => {
    const added: [JobPayload, QueueLevel][] = [];
    queue.add = (_jobId, payload, level) => {
      added.push([payload, level]);
      return Promise.resolve('queue_full');
    };
    const send = async (path: string, request: object) => {
      const res = await fetch(`http://127.0.0.1:${port()}${path}`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify(request),
      });
      await res.text();
    };
    // vLLM's CompletionRequest has no messages field: an empty one must not hide the prompt.
    const prompt = 'x'.repeat(40_000);
    await send('/v1/completions', { model: 'm', prompt, messages: [] });
    // and chat reads messages ("user" + "abcd": 8 characters), never a prompt beside them
    await send('/v1/chat/completions', {
      model: 'm',
      messages: [{ role: 'user', content: 'abcd' }],
      prompt,
    });
    expect(added.map(([p]) => p.promptTokens)).toEqual([10_000, 2]);
    expect(added.map(([, level]) => level)).toEqual(['long', 'short']);
  });

  it("puts the request id and the client's trace context and data-parallel rank in the job, dropping malformed ones", async () => {
    const worker = new Worker(queue.queue.name, null, {
      connection: bull,
      prefix: keys.prefix,
      autorun: false,
    });
    /** The job a request with `headers` becomes, as a dispatcher reads it back; then answered. */
    const jobOf = async (headers: Record<string, string>) => {
      const answer = fetch(`http://127.0.0.1:${port()}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', ...headers },
        body,
      });
      const job = await eventually(
        () => worker.getNextJob('dispatcher', { block: false }),
        'the job',
      );
      const payload = validateJobPayload(job.data);
      const held = replies.held.get(job.id!)!;
      const jobId = job.id!;
      held.onFrame({ type: 'start', jobId, seq: 0, info: { engine: 'e', loadState: 'normal' } });
      held.onFrame({
        type: 'head',
        jobId,
        seq: 1,
        info: { status: 200, contentType: 'text/event-stream' },
      });
      held.onFrame({ type: 'end', jobId, seq: 2 });
      const res = await answer;
      expect(res.status).toBe(200);
      await res.text();
      return { payload, id: res.headers.get('x-request-id') };
    };
    const traceparent = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01';
    try {
      const carried = await jobOf({
        'x-request-id': 'client-req-42',
        traceparent,
        tracestate: 'rojo=00f067aa0ba902b7,congo=t61rcWkgMzE',
        'x-data-parallel-rank': '3',
      });
      expect(carried.payload).toMatchObject({
        requestId: 'client-req-42',
        traceparent,
        tracestate: 'rojo=00f067aa0ba902b7,congo=t61rcWkgMzE',
        dataParallelRank: '3',
      });
      expect(carried.id).toBe('client-req-42');
      // Malformed: dropped, the request served all the same; the id is the one it answers with.
      const dropped = await jobOf({
        'x-request-id': 'not a safe id',
        traceparent: traceparent.toUpperCase(),
        tracestate: 'congo=t61rcWkgMzE',
        'x-data-parallel-rank': '-1',
      });
      expect(dropped.payload.requestId).toMatch(/^[0-9a-f-]{36}$/);
      expect(dropped.payload.requestId).toBe(dropped.id);
      expect(dropped.payload).not.toHaveProperty('traceparent');
      expect(dropped.payload).not.toHaveProperty('tracestate');
      expect(dropped.payload).not.toHaveProperty('dataParallelRank');
      // A tracestate without a well-formed traceparent is not used (W3C); a lone rank is.
      const rankOnly = await jobOf({ tracestate: 'congo=1', 'x-data-parallel-rank': '0' });
      expect(rankOnly.payload).not.toHaveProperty('tracestate');
      expect(rankOnly.payload.dataParallelRank).toBe('0');
    } finally {
      await worker.close();
    }
  });

  it('queues nothing for a client that left while the route awaited the leader check', async () => {
    const leader = gate();
    const hasLeader = queue.hasLeader.bind(queue);
    queue.hasLeader = () => leader.pass().then(hasLeader);
    const adds: Promise<unknown>[] = [];
    let addCalled!: (what: 'added') => void;
    const added = new Promise<'added'>((resolve) => (addCalled = resolve));
    const realAdd = queue.add.bind(queue);
    queue.add = (...args) => {
      adds.push(realAdd(...args));
      addCalled('added');
      return adds.at(-1) as ReturnType<typeof realAdd>;
    };

    const serverSide = new Promise<Socket>((resolve) => app.server.once('connection', resolve));
    const client = connect(port(), '127.0.0.1');
    await once(client, 'connect');
    client.write(
      `POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\n\r\n${body}`,
    );
    await leader.reached;
    const socket = await serverSide;
    const closed = once(socket, 'close');
    client.destroy();
    await closed;
    const end = nextEnd();
    leader.open();

    // Either the request ends as a departed client, or (the fault) its job is added.
    const first = await Promise.race([end, added]);
    await Promise.all(adds);
    expect(adds).toHaveLength(0);
    expect(first).toMatchObject({ status: 499, reason: 'cancelled', stream: true });
    expect(await queuedJobs(redis, 'sluice', queue.pool.name)).toBe(0);
    expect(replies.held.size).toBe(0);
  });

  it("keeps a client's answer when its add, given up on, had landed and its job runs", async () => {
    const add = gate();
    const realAdd = queue.add.bind(queue);
    let landed: Promise<unknown> = Promise.resolve();
    queue.add = (...args) => {
      const adding = add.pass().then(() => realAdd(...args));
      landed = adding;
      return adding;
    };
    const answer = post();
    await add.reached;
    // The dispatcher runs the job while the add's answer is late.
    const held = heldNow();
    let seq = 0;
    const jobId = held.jobId;
    held.onFrame({ type: 'start', jobId, seq: seq++, info: { engine: 'e', loadState: 'normal' } });
    held.onFrame({
      type: 'head',
      jobId,
      seq: seq++,
      info: { status: 200, contentType: 'text/event-stream' },
    });
    held.onFrame({ type: 'data', jobId, seq: seq++, chunk: Buffer.from('data: a\n\n') });
    await eventually(() => logLines.some((l) => l.msg === 'enqueue failed'), 'the add given up');
    held.onFrame({ type: 'data', jobId, seq: seq++, chunk: Buffer.from('data: b\n\n') });
    held.onFrame({ type: 'end', jobId, seq: seq++ });
    const res = await answer;
    expect(res.status).toBe(200);
    expect(await res.text()).toBe('data: a\n\ndata: b\n\n');
    expect(held.status).toBe(200);
    add.open();
    await landed;
  });

  it('cancels a job whose add landed after its client was answered and that a dispatcher took', async () => {
    const add = gate();
    const realAdd = queue.add.bind(queue);
    const worker = new Worker(queue.queue.name, null, {
      connection: bull,
      prefix: keys.prefix,
      autorun: false,
    });
    // The add lands late, and a dispatcher takes the job before the gateway can remove it.
    let taken: string | undefined;
    queue.add = (...args) =>
      add.pass().then(async () => {
        const refused = await realAdd(...args);
        taken = (await worker.getNextJob('dispatcher', { block: false }))?.id;
        return refused;
      });
    try {
      const res = await post();
      expect(res.status).toBe(503);
      expect(res.headers.get('x-sluice-reject-reason')).toBe('redis_unavailable');
      const [end] = ended;
      add.open();
      await eventually(() => cancels.length > 0, 'the cancel');
      expect(taken).toBe(end!.jobId);
      expect(cancels).toEqual([[end!.jobId, 'redis_unavailable']]);
    } finally {
      await worker.close();
    }
  });
});
