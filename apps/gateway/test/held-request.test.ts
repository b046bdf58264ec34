// One held client against a real redis-server (BullMQ queue through PoolQueue) and real
// sockets: an HTTP server whose handler holds the request, and a client that reads, or not.
import { once } from 'node:events';
import { createServer, type Server, type ServerResponse } from 'node:http';
import { connect, type AddressInfo, type Socket } from 'node:net';
import { defaultDegradation, type PoolConfig } from '@sluice/config';
import { keySpace, type Frame, type JobPayload } from '@sluice/protocol';
import { createRedis, redisReady, type Redis } from '@sluice/redis';
import { eventually, startRedis, type TestRedis } from '@sluice/test/support';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it, vi } from 'vitest';
import { HeldRequest, type HeldRequestHooks } from '../src/held-request.ts';
import { PoolQueue } from '../src/pool-queue.ts';
import { refusal } from '../src/refuse.ts';

let server: TestRedis;
let redis: Redis;
let bull: Redis;
let queue: PoolQueue;
let http: Server;
let port: number;
/** The next request's response, handed to the test by the HTTP server. */
let nextResponse: ((res: ServerResponse) => void) | undefined;

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
  await Promise.all([redisReady(redis), redisReady(bull)]);
  queue = new PoolQueue(pool, keySpace('sluice'), redis, bull, 10, Date.now);
  http = createServer((_req, res) => {
    // One request per connection: a kept-alive socket closed between tests would swallow the next.
    res.shouldKeepAlive = false;
    nextResponse?.(res);
  });
  http.listen(0, '127.0.0.1');
  await once(http, 'listening');
  port = (http.address() as AddressInfo).port;
});
beforeEach(() => redis.flushall());
afterEach(() => {
  http.closeAllConnections();
});
afterAll(async () => {
  http.close();
  await queue.close();
  await Promise.all([redis.quit(), bull.quit()]);
  await server.stop();
});

interface Recorded {
  cancels: [string, string][];
  refused: string[];
  done: Promise<boolean>;
}

function hooks(overrides: Partial<HeldRequestHooks> = {}): HeldRequestHooks & Recorded {
  let markDone: (wasQueued: boolean) => void = () => {};
  const recorded: Recorded = {
    cancels: [],
    refused: [],
    done: new Promise((resolve) => (markDone = resolve)),
  };
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
    onDone: (_held, wasQueued) => markDone(wasQueued),
    ...overrides,
  };
}

/** A client request to the test server, and the HeldRequest for it, not held yet. */
async function arrived(jobId: string, h: HeldRequestHooks, stream = true) {
  const served = new Promise<ServerResponse>((resolve) => (nextResponse = resolve));
  const answer = fetch(`http://127.0.0.1:${port}/`, { method: 'POST', body: '{}' });
  const request = new HeldRequest(jobId, 'm', stream, Date.now(), Date.now(), await served, h);
  return { request, answer };
}

/** A client request to the test server, and the HeldRequest holding it there. */
async function held(jobId: string, h: HeldRequestHooks, stream = true) {
  const client = await arrived(jobId, h, stream);
  client.request.hold();
  return client;
}

/** A request over a raw socket, which a test can pause or destroy; `res` is the server's side. */
async function rawClient() {
  const served = new Promise<ServerResponse>((resolve) => (nextResponse = resolve));
  const socket = connect(port, '127.0.0.1');
  await once(socket, 'connect');
  socket.write('POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}');
  return { socket, res: await served };
}

/** A frame without its job id and sequence number (distributed over the union). */
type FrameBody = Frame extends infer F
  ? F extends Frame
    ? Omit<F, 'jobId' | 'seq'>
    : never
  : never;

let seq = 0;
function frame(jobId: string, f: FrameBody, at = seq++): Frame {
  return { ...f, jobId, seq: at } as Frame;
}

describe('HeldRequest', () => {
  it('relays the frames of a stream to the client and ends when the engine does', async () => {
    const h = hooks();
    const { request, answer } = await held('j1', h);
    seq = 0;
    request.onFrame(frame('j1', { type: 'start', info: { engine: 'e', loadState: 'normal' } }));
    request.onFrame(
      frame('j1', { type: 'head', info: { status: 200, contentType: 'text/event-stream' } }),
    );
    expect(request.firstByteAt).toBeUndefined();
    request.onFrame(frame('j1', { type: 'data', chunk: Buffer.from('data: hi\n\n') }));
    expect(request.firstByteAt).toBeGreaterThanOrEqual(request.receivedAt);
    request.onFrame(frame('j1', { type: 'end', info: { completionTokens: 1, promptTokens: 4 } }));
    const res = await answer;
    expect(res.status).toBe(200);
    expect(await res.text()).toBe('data: hi\n\n');
    expect(await h.done).toBe(false);
    expect(h.cancels).toEqual([]);
    // What the access log reads.
    expect(request.status).toBe(200);
    expect(request.reason).toBeUndefined();
    expect(request.queueWaitMs).toBeGreaterThanOrEqual(0);
    expect(request.tokens).toEqual({ completionTokens: 1, promptTokens: 4 });
  });

  it("takes a new leader's error frame 0 for a job that had started as the job's end, not a lost frame", async () => {
    const h = hooks();
    const { request, answer } = await held('j0', h, false);
    request.onFrame(frame('j0', { type: 'start', info: { engine: 'e', loadState: 'normal' } }, 0));
    request.onFrame(frame('j0', { type: 'alive' }, 1));
    // The dead leader's relay had counted to 1; the new one's relay starts again at 0.
    request.onFrame(
      frame(
        'j0',
        {
          type: 'error',
          info: { code: 'dispatcher_lost', message: 'the dispatcher died', retryAfter: 1 },
        },
        0,
      ),
    );
    const res = await answer;
    expect(res.status).toBe(503);
    expect(res.headers.get('x-sluice-reject-reason')).toBe('dispatcher_lost');
    expect(request.reason).toBe('dispatcher_lost');
  });

  it('records a client that left as 499 cancelled, and cancels its engine request', async () => {
    const h = hooks();
    const { socket, res } = await rawClient();
    const request = new HeldRequest('gone', 'm', true, Date.now(), Date.now(), res, h);
    request.hold();
    seq = 0;
    request.onFrame(frame('gone', { type: 'start', info: { engine: 'e', loadState: 'normal' } }));
    request.onFrame(
      frame('gone', { type: 'head', info: { status: 200, contentType: 'text/event-stream' } }),
    );
    socket.destroy();
    expect(await h.done).toBe(false);
    expect(request.status).toBe(499);
    expect(request.reason).toBe('cancelled');
    expect(request.firstByteAt).toBeUndefined();
    await eventually(() => h.cancels.length > 0, 'the cancel');
    expect(h.cancels).toEqual([['gone', 'client_gone']]);
  });

  it('counts the queue wait up to the release, not up to the start frame that travelled with the head', async () => {
    let clock = 10_000;
    let waited: number | undefined;
    const h = hooks({ now: () => clock, onStarted: (_held, seconds) => (waited = seconds) });
    const served = new Promise<ServerResponse>((resolve) => (nextResponse = resolve));
    const answer = fetch(`http://127.0.0.1:${port}/`, { method: 'POST', body: '{}' });
    const request = new HeldRequest('jw', 'm', false, 9_000, 9_000, await served, h);
    request.hold();
    clock = 12_500;
    const info = { engine: 'e', loadState: 'normal', sentAfterMs: 1_500 };
    request.onFrame(frame('jw', { type: 'start', info }, 0));
    expect(waited).toBe(2);
    request.onFrame(frame('jw', { type: 'head', info: { status: 200, contentType: 'a/b' } }, 1));
    request.onFrame(frame('jw', { type: 'end' }, 2));
    expect((await answer).status).toBe(200);
  });

  it('answers a parked client whose job Redis lost 503 queue_lost at the park limit, not park_timeout', async () => {
    const h = hooks({ maxParkMs: 300 });
    const { request, answer } = await arrived('lost', h);
    expect(await queue.add('lost', payload, 'short')).toBeUndefined();
    request.added = true;
    expect(request.parked).toBe(true);
    await redis.flushall(); // Redis restarted empty
    // Held (the park limit started) only once the job is gone: on a busy machine the add and
    // the flush can take longer than the limit, which would then find the job still queued.
    request.hold();
    const res = await answer;
    expect(res.status).toBe(503);
    expect(res.headers.get('x-sluice-reject-reason')).toBe('queue_lost');
    expect(Number(res.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);
    expect(h.refused).toEqual(['queue_lost']);
  });

  it('answers a job still queued at the park limit 503 park_timeout and removes it', async () => {
    const h = hooks({ maxParkMs: 300 });
    const { request, answer } = await arrived('waits', h);
    expect(await queue.add('waits', payload, 'short')).toBeUndefined();
    request.added = true;
    request.hold(); // only now: on a busy machine the add alone can outlast the limit
    const res = await answer;
    expect(res.status).toBe(503);
    expect(res.headers.get('x-sluice-reject-reason')).toBe('park_timeout');
    expect(res.headers.get('retry-after')).toBe('7');
    expect(await redis.exists(queue.jobKey('waits'))).toBe(0);
  });

  it('abandoned while queued: 503 with the reason given, and the job leaves the queue without a cancel', async () => {
    const h = hooks();
    const { request, answer } = await held('q', h);
    expect(await queue.add('q', payload, 'short')).toBeUndefined();
    request.added = true;
    const takeBack = request.abandon(refusal('shutting_down', 'bye'), 'shutting_down');
    const res = await answer;
    expect(res.status).toBe(503);
    expect(res.headers.get('x-sluice-reject-reason')).toBe('shutting_down');
    await takeBack();
    expect(await redis.exists(queue.jobKey('q'))).toBe(0);
    expect(h.cancels).toEqual([]);
  });

  it('abandoned while running: the error goes in-band and the engine request is cancelled', async () => {
    const h = hooks();
    const { request, answer } = await held('r', h);
    seq = 0;
    request.onFrame(frame('r', { type: 'start', info: { engine: 'e', loadState: 'normal' } }));
    request.onFrame(
      frame('r', { type: 'head', info: { status: 200, contentType: 'text/event-stream' } }),
    );
    request.onFrame(frame('r', { type: 'data', chunk: Buffer.from('data: a\n\n') }));
    const takeBack = request.abandon(refusal('redis_unavailable', 'gone'), 'redis_unavailable');
    const res = await answer;
    expect(res.status).toBe(200);
    expect(await res.text()).toMatch(/^data: a\n\ndata: \{"error":.*"code":"redis_unavailable"/);
    // Sent as 200, but the answer amounts to the refusal's status.
    expect(request.status).toBe(503);
    expect(request.reason).toBe('redis_unavailable');
    expect(h.cancels).toEqual([]); // taken back only when the caller says so (Redis back)
    await takeBack();
    expect(h.cancels).toEqual([['r', 'redis_unavailable']]);
  });

  it('cuts a client whose socket has not drained for the stall limit and cancels its engine request', async () => {
    const h = hooks({ slowClientStallMs: 200 });
    const { socket, res } = await rawClient();
    socket.pause(); // reads nothing from here on
    const request = new HeldRequest('slow', 'm', true, Date.now(), Date.now(), res, h);
    request.hold();
    seq = 0;
    request.onFrame(frame('slow', { type: 'start', info: { engine: 'e', loadState: 'normal' } }));
    request.onFrame(
      frame('slow', { type: 'head', info: { status: 200, contentType: 'text/event-stream' } }),
    );
    // The engine keeps producing; the kernel's buffers fill, then the response stops draining.
    const chunk = Buffer.from(`data: ${'x'.repeat(64 * 1024)}\n\n`);
    const engine = setInterval(() => request.onFrame(frame('slow', { type: 'data', chunk })), 10);
    await h.done.finally(() => clearInterval(engine));
    expect(res.writableLength).toBeLessThan(h.slowClientBytes);
    await h.done;
    expect(h.cancels).toEqual([['slow', 'slow_client']]);
    expect(h.refused).toEqual(['slow_client']);
    socket.destroy();
  });

  it('cuts a client that stopped reading before the end of its answer once the stall limit passes', async () => {
    const h = hooks({ slowClientStallMs: 200 });
    const { socket, res } = await rawClient();
    socket.pause(); // reads nothing from here on
    const request = new HeldRequest('tail', 'm', false, Date.now(), Date.now(), res, h);
    request.hold();
    seq = 0;
    request.onFrame(frame('tail', { type: 'start', info: { engine: 'e', loadState: 'normal' } }));
    request.onFrame(
      frame('tail', { type: 'head', info: { status: 200, contentType: 'application/json' } }),
    );
    // Far more than the kernel buffers for an unread loopback socket, far below the byte bound.
    request.onFrame(frame('tail', { type: 'data', chunk: Buffer.alloc(64 * 1024 ** 2, 'x') }));
    const serverSocket = res.socket!;
    request.onFrame(frame('tail', { type: 'end' }));
    expect(await h.done).toBe(false);
    // Still buffered here, past what the kernel took: only a read could take it now.
    expect(res.writableLength).toBeGreaterThan(0);
    await once(res, 'close');
    expect(serverSocket.destroyed).toBe(true);
    // The engine had answered: nothing to cancel, and the answer stays as sent.
    expect(h.cancels).toEqual([]);
    expect(request.status).toBe(200);
    socket.destroy();
  });

  it('ends a client that left before hold() at once as 499 cancelled, with no job to take back', async () => {
    const h = hooks();
    const { socket, res } = await rawClient();
    // It leaves while the route still awaits (the leader check): 'close' fires before hold().
    const closed = once(res, 'close');
    socket.destroy();
    await closed;
    const request = new HeldRequest('early', 'm', true, Date.now(), Date.now(), res, h);
    request.hold();
    expect(request.state).toBe('done');
    expect(await h.done).toBe(true);
    expect(request.status).toBe(499);
    expect(request.reason).toBe('cancelled');
    expect(h.refused).toEqual(['cancelled']);
    expect(h.cancels).toEqual([]);
  });

  it('sends no keep-alive into the body of an engine error that went out before the first heartbeat', async () => {
    // Only the heartbeat's interval is faked: the sockets keep their real timers.
    vi.useFakeTimers({ toFake: ['setInterval', 'clearInterval'] });
    try {
      let heartbeats = 0;
      const h = hooks({ heartbeatMs: 1000, onHeartbeat: () => (heartbeats += 1) });
      const { request, answer } = await held('err', h);
      seq = 0;
      request.onFrame(frame('err', { type: 'start', info: { engine: 'e', loadState: 'normal' } }));
      request.onFrame(
        frame('err', { type: 'head', info: { status: 400, contentType: 'application/json' } }),
      );
      vi.advanceTimersByTime(3000); // three heartbeats' worth while the engine's body is due
      const body = '{"error":{"message":"too long"}}';
      request.onFrame(frame('err', { type: 'data', chunk: Buffer.from(body) }));
      request.onFrame(frame('err', { type: 'end' }));
      const res = await answer;
      expect(res.status).toBe(400);
      expect(res.headers.get('content-type')).toBe('application/json');
      expect(await res.text()).toBe(body);
      expect(heartbeats).toBe(0);
    } finally {
      vi.useRealTimers();
    }
  });
});

/** The events of an SSE body as a client reads them: blank-line separated, `data:` lines joined. */
function sseEvents(text: string): string[] {
  return text
    .split(/\r?\n\r?\n/)
    .filter((block) => block !== '')
    .map((block) =>
      block
        .split(/\r?\n/)
        .filter((line) => line.startsWith('data:'))
        .map((line) => line.slice(5).trimStart())
        .join('\n'),
    )
    .filter((data) => data !== '');
}

/** A stream opened for a held client: start and head frames sent, the next seq returned. */
function opened(request: HeldRequest, jobId: string, contentType = 'text/event-stream'): number {
  request.onFrame(frame(jobId, { type: 'start', info: { engine: 'e', loadState: 'normal' } }, 0));
  request.onFrame(frame(jobId, { type: 'head', info: { status: 200, contentType } }, 1));
  return 2;
}

describe('HeldRequest: engine details for tenants (SLUICE_TENANT_ENGINE_DETAILS)', () => {
  const unreachable = 'engine 10.0.0.7:8000 unreachable: connect ECONNREFUSED 10.0.0.7:8000';

  /** A request the engine `10.0.0.7:8000` started and then failed with `code`. */
  async function failedOnEngine(jobId: string, engineDetails: boolean, started: boolean) {
    const h = hooks({ engineDetails });
    const { request, answer } = await held(jobId, h, false);
    seq = 0;
    if (started) {
      const start = { engine: '10.0.0.7:8000', loadState: 'normal' };
      request.onFrame(frame(jobId, { type: 'start', info: start }));
      request.onFrame(
        frame(jobId, { type: 'head', info: { status: 200, contentType: 'application/json' } }),
      );
      request.onFrame(frame(jobId, { type: 'data', chunk: Buffer.from('{"id":"x"}') }));
      request.onFrame(
        frame(jobId, { type: 'end', info: { completionTokens: 1, promptTokens: 1 } }),
      );
    } else {
      const info = { code: 'engine_unreachable', message: unreachable, retryAfter: 5 } as const;
      request.onFrame(frame(jobId, { type: 'error', info }));
    }
    return { request, res: await answer };
  }

  it('tells a tenant a fixed message for an engine failure, keeping the full one for the access log', async () => {
    const { request, res } = await failedOnEngine('hide-err', false, false);
    expect(res.status).toBe(503);
    expect(res.headers.get('retry-after')).toBe('5');
    const body = await res.text();
    expect(body).not.toContain('10.0.0.7');
    expect(JSON.parse(body).error).toMatchObject({
      message: 'the engine could not be reached; retry later',
      code: 'engine_unreachable',
    });
    expect(request.reason).toBe('engine_unreachable');
    expect(request.detail).toBe(unreachable);
  });

  it("sends no x-sluice-engine to a tenant, and the engine's name where details are shown", async () => {
    const hidden = await failedOnEngine('hide-ok', false, true);
    expect(hidden.res.status).toBe(200);
    expect(hidden.res.headers.get('x-sluice-engine')).toBeNull();
    expect(hidden.res.headers.get('x-sluice-load-state')).toBe('normal');
    const shown = await failedOnEngine('show-ok', true, true);
    expect(shown.res.headers.get('x-sluice-engine')).toBe('10.0.0.7:8000');
  });

  it('passes the full message on where details are shown, and leaves refusals that name no engine alone', async () => {
    const shown = await failedOnEngine('show-err', true, false);
    expect(JSON.parse(await shown.res.text()).error.message).toBe(unreachable);
    expect(shown.request.detail).toBeUndefined();
    const h = hooks({ engineDetails: false });
    const { request, answer } = await held('hide-lost', h, false);
    const info = {
      code: 'dispatcher_lost',
      message: 'the dispatcher died',
      retryAfter: 1,
    } as const;
    request.onFrame(frame('hide-lost', { type: 'error', info }, 0));
    expect(JSON.parse(await (await answer).text()).error.message).toBe('the dispatcher died');
    expect(request.detail).toBeUndefined();
  });
});

describe('HeldRequest: an event stream cut anywhere by TCP', () => {
  const whole = 'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","n":1}\n\n';

  it('writes an in-band error on an event boundary when the last chunk stopped mid-event', async () => {
    const h = hooks();
    const { request, answer } = await held('half', h);
    let at = opened(request, 'half');
    const half = 'data: {"id":"chatcmpl-1","object":"chat.';
    request.onFrame(frame('half', { type: 'data', chunk: Buffer.from(whole + half) }, at++));
    const info = { code: 'engine_error' as const, message: 'engine connection lost' };
    request.onFrame(frame('half', { type: 'error', info }, at++));
    const text = await (await answer).text();
    expect(text.startsWith(whole)).toBe(true);
    // What an OpenAI SDK does with each event: every one parses, the last is the error, and
    // the stream ends with [DONE] after it, as vLLM ends a stream that failed.
    const events = sseEvents(text);
    expect(events.at(-1)).toBe('[DONE]');
    const parsed = events.slice(0, -1).map((data) => JSON.parse(data) as Record<string, unknown>);
    expect(parsed).toHaveLength(2);
    expect(parsed[1]).toMatchObject({ error: { code: 'engine_error' } });
    expect(request.reason).toBe('engine_error');
  });

  it('holds an incomplete event until the next chunk completes it, and ends with every byte', async () => {
    const h = hooks();
    const { request, answer } = await held('tail', h);
    let at = opened(request, 'tail');
    // Cut inside an event, inside its blank line, and an end without a final blank line.
    for (const piece of [whole.slice(0, 20), whole.slice(20, -1), '\ndata: [DO', 'NE]'])
      request.onFrame(frame('tail', { type: 'data', chunk: Buffer.from(piece) }, at++));
    request.onFrame(frame('tail', { type: 'end' }, at++));
    expect(await (await answer).text()).toBe(`${whole}data: [DONE]`);
    expect(request.status).toBe(200);
  });

  it('leaves a JSON answer to a stream request as the engine cut it', async () => {
    const h = hooks();
    const { request, answer } = await held('json', h, false);
    let at = opened(request, 'json', 'application/json');
    request.onFrame(frame('json', { type: 'data', chunk: Buffer.from('{"a":') }, at++));
    request.onFrame(frame('json', { type: 'data', chunk: Buffer.from('1}') }, at++));
    request.onFrame(frame('json', { type: 'end' }, at++));
    expect(await (await answer).text()).toBe('{"a":1}');
  });
});

describe('HeldRequest: the slow-client byte bound', () => {
  const MiB = 1024 ** 2;

  it('gets a non-streamed answer larger than the bound, in one frame, whole to a client that reads', async () => {
    const h = hooks({ slowClientBytes: 4 * MiB });
    const { request, answer } = await held('big', h, false);
    let at = opened(request, 'big', 'application/json');
    const body = Buffer.alloc(6 * MiB, '{"x":"0123456789abcdef"}');
    request.onFrame(frame('big', { type: 'data', chunk: body }, at++));
    request.onFrame(frame('big', { type: 'end' }, at++));
    const res = await answer;
    expect(res.status).toBe(200);
    expect(Buffer.from(await res.arrayBuffer()).equals(body)).toBe(true);
    expect(h.refused).toEqual([]);
    expect(h.cancels).toEqual([]);
  });

  it("gets a non-streamed answer far larger than the bound, in the relay's 256 KiB frames, whole to a client that reads", async () => {
    const h = hooks({ slowClientBytes: MiB });
    const { request, answer } = await held('frames', h, false);
    let at = opened(request, 'frames', 'application/json');
    const body = Buffer.alloc(12 * MiB, '{"x":"0123456789abcdef"}');
    // As a bundle of frames comes, in one turn: the client, however fast, reads none of it
    // meanwhile, and the kernel takes a few MiB at most.
    for (let i = 0; i < body.length; i += 256 * 1024)
      request.onFrame(
        frame('frames', { type: 'data', chunk: body.subarray(i, i + 256 * 1024) }, at++),
      );
    request.onFrame(frame('frames', { type: 'end' }, at++));
    const res = await answer;
    expect(res.status).toBe(200);
    expect(Buffer.from(await res.arrayBuffer()).equals(body)).toBe(true);
    expect(h.refused).toEqual([]);
    expect(h.cancels).toEqual([]);
  });

  it('keeps a non-streamed answer going to a client that reads it more slowly than the stall limit, taking bytes all along', async () => {
    // The byte bound is out of reach: only the stall limit could cut it.
    const h = hooks({ slowClientStallMs: 1000 });
    const { socket, res } = await rawClient();
    socket.pause();
    const request = new HeldRequest('slow', 'm', false, Date.now(), Date.now(), res, h);
    request.hold();
    let at = opened(request, 'slow', 'application/json');
    const body = Buffer.alloc(24 * MiB, '{"x":"0123456789abcdef"}');
    for (let i = 0; i < body.length; i += 256 * 1024)
      request.onFrame(
        frame('slow', { type: 'data', chunk: body.subarray(i, i + 256 * 1024) }, at++),
      );
    // A reader of about 4 MiB/s: the answer takes several stall limits to read, and its
    // socket does not drain before the end, while every stall limit sees bytes taken.
    const read = paced(socket, 256 * 1024, 62);
    // The end comes halfway through, so both the answer under way and the answer ended are
    // read slowly.
    await read.reached(body.length / 2);
    expect(request.state).toBe('running');
    request.onFrame(frame('slow', { type: 'end' }, at++));
    const received = await read.all;
    expect(h.refused).toEqual([]);
    expect(h.cancels).toEqual([]);
    expect(request.status).toBe(200);
    expect(dechunked(received).equals(body)).toBe(true);
  }, 60_000);

  it('still cuts a stream whose client stopped reading once more than the bound is left unread', async () => {
    // The stall limit is out of reach: only the byte bound can cut it.
    const h = hooks({ slowClientBytes: 4 * MiB, slowClientStallMs: 600_000 });
    const { socket, res } = await rawClient();
    socket.pause();
    const request = new HeldRequest('stop', 'm', true, Date.now(), Date.now(), res, h);
    request.hold();
    let at = opened(request, 'stop');
    const chunk = Buffer.from(`data: ${'x'.repeat(64 * 1024)}\n\n`);
    // Written in one turn: the socket takes no more than its first write meanwhile, so a
    // client-side kernel buffer of any size cannot hide the backlog. Bounded, should the bound
    // not hold.
    for (let written = 0; request.state !== 'done' && written < 256 * MiB; written += chunk.length)
      request.onFrame(frame('stop', { type: 'data', chunk }, at++));
    expect(request.state).toBe('done');
    expect(h.refused).toEqual(['slow_client']);
    expect(h.cancels).toEqual([['stop', 'slow_client']]);
    socket.destroy();
  });

  it('fails a stream request whose JSON answer has frames still unsent without writing after its end', async () => {
    const h = hooks({ slowClientBytes: 4 * MiB });
    const { socket, res } = await rawClient();
    socket.pause();
    const errors: Error[] = [];
    res.on('error', (err) => errors.push(err));
    const request = new HeldRequest('late', 'm', true, Date.now(), Date.now(), res, h);
    request.hold();
    request.onFrame(
      frame('late', { type: 'start', info: { engine: 'e', loadState: 'normal' } }, 0),
    );
    // An engine's error answer to a stream request: a JSON body, not events (sendAnswer).
    request.onFrame(
      frame('late', { type: 'head', info: { status: 500, contentType: 'application/json' } }, 1),
    );
    for (let at = 2; at < 6; at++)
      request.onFrame(frame('late', { type: 'data', chunk: Buffer.alloc(4 * MiB, 'x') }, at));
    request.onFrame(
      frame('late', { type: 'error', info: { code: 'engine_error', message: 'gone' } }, 6),
    );
    const finished = once(res, 'finish');
    socket.resume();
    await finished;
    // A write after the end is reported on the next tick: let it come, if it does.
    await new Promise((resolve) => setImmediate(resolve));
    expect(errors).toEqual([]);
    socket.destroy();
  });

  it('cuts a client that stopped reading in the middle of one large frame once the stall limit passes', async () => {
    const h = hooks({ slowClientBytes: 4 * MiB, slowClientStallMs: 200 });
    const { socket, res } = await rawClient();
    socket.pause();
    const request = new HeldRequest('stuck', 'm', false, Date.now(), Date.now(), res, h);
    request.hold();
    let at = opened(request, 'stuck', 'application/json');
    // Far more than the kernel buffers for an unread loopback socket.
    request.onFrame(frame('stuck', { type: 'data', chunk: Buffer.alloc(64 * MiB, 'x') }, at++));
    await h.done;
    expect(h.refused).toEqual(['slow_client']);
    expect(h.cancels).toEqual([['stuck', 'slow_client']]);
    socket.destroy();
  });
});

/**
 * Reads `socket` at a paced rate, `slice` bytes every `everyMs`: a client on a slow link.
 * `all` resolves with everything once the connection closed.
 */
function paced(socket: Socket, slice: number, everyMs: number) {
  const chunks: Buffer[] = [];
  let bytes = 0;
  let inSlice = 0;
  const waiting: { n: number; resolve: () => void }[] = [];
  socket.on('data', (chunk: Buffer) => {
    chunks.push(chunk);
    bytes += chunk.length;
    inSlice += chunk.length;
    for (const w of waiting.filter((w) => bytes >= w.n)) w.resolve();
    if (inSlice < slice) return;
    // The pace of the reader, not a wait for anything.
    socket.pause();
    inSlice = 0;
    setTimeout(() => socket.resume(), everyMs);
  });
  // A connection cut is an end too: what came before it is what the client got.
  socket.on('error', () => {});
  let closed = false;
  const all = once(socket, 'close').then(() => {
    closed = true;
    for (const w of waiting) w.resolve();
    return Buffer.concat(chunks);
  });
  socket.resume();
  return {
    /** Resolves once `n` bytes came, or the connection closed before. */
    reached: (n: number) =>
      new Promise<void>((resolve) =>
        bytes >= n || closed ? resolve() : waiting.push({ n, resolve }),
      ),
    all,
  };
}

/** The body of a raw HTTP/1.1 response sent with chunked transfer coding. */
function dechunked(response: Buffer): Buffer {
  let at = response.indexOf('\r\n\r\n') + 4;
  const parts: Buffer[] = [];
  for (;;) {
    const eol = response.indexOf('\r\n', at);
    const size = parseInt(response.toString('latin1', at, eol), 16);
    if (eol < 0 || !(size >= 0)) throw new Error(`response cut at byte ${at}`);
    if (size === 0) return Buffer.concat(parts);
    parts.push(response.subarray(eol + 2, eol + 2 + size));
    at = eol + 2 + size + 2;
  }
}

describe('HeldRequest: an engine error after the stream went out as 200', () => {
  /**
   * A stream whose head a heartbeat sent (it waited past SSE_HEARTBEAT_SECONDS), then the
   * engine's error answer `body` in the chunks given; resolves to what the client read.
   */
  async function engineErrorAfterHead(
    jobId: string,
    status: number,
    chunks: string[],
    h = hooks(),
  ) {
    // Only the heartbeat's interval is faked: the sockets keep their real timers.
    vi.useFakeTimers({ toFake: ['setInterval', 'clearInterval'] });
    try {
      const { request, answer } = await held(jobId, { ...h, heartbeatMs: 1000 });
      vi.advanceTimersByTime(1000); // the head goes out with the first keep-alive
      request.onFrame(
        frame(jobId, { type: 'start', info: { engine: 'e', loadState: 'normal' } }, 0),
      );
      const info = { status, contentType: 'application/json' };
      request.onFrame(frame(jobId, { type: 'head', info }, 1));
      let at = 2;
      for (const chunk of chunks)
        request.onFrame(frame(jobId, { type: 'data', chunk: Buffer.from(chunk) }, at++));
      request.onFrame(frame(jobId, { type: 'end' }, at++));
      const res = await answer;
      expect(res.status).toBe(200);
      const text = await res.text();
      // What the access log and the metrics read: the engine's status, as an engine error.
      expect(request.status).toBe(status);
      expect(request.reason).toBe('engine_error');
      return text;
    } finally {
      vi.useRealTimers();
    }
  }

  /** What went out before the error: the head's keep-alive, the load state at the start. */
  const before = ': keep-alive\n\n: x-sluice-load-state: normal\n\n';
  // vLLM's ErrorResponse (vllm/entrypoints/openai/engine/protocol.py), as it answers a prompt
  // past max_model_len.
  const vllmError = {
    error: {
      message:
        "This model's maximum context length is 4096 tokens. However, your request has 5000 input tokens. Please reduce the length of the input messages.",
      type: 'BadRequestError',
      param: 'input_tokens',
      code: 400,
    },
  };

  it("sends vLLM's error body unchanged as the error event, then [DONE], as vLLM ends a failed stream", async () => {
    const body = JSON.stringify(vllmError);
    const text = await engineErrorAfterHead('v', 400, [body.slice(0, 30), body.slice(30)]);
    expect(text).toBe(`${before}data: ${body}\n\ndata: [DONE]\n\n`);
  });

  it('keeps a pretty-printed error body in one event on one data line', async () => {
    const body = JSON.stringify(vllmError, null, 2).replace(/\n/g, '\r\n') + '\n';
    const text = await engineErrorAfterHead('pretty', 400, [body]);
    expect(text.startsWith(`${before}data: {`)).toBe(true);
    expect(text.endsWith('}\n\ndata: [DONE]\n\n')).toBe(true);
    const events = text.slice(before.length).split('\n\n');
    expect(events).toHaveLength(3); // the error, [DONE], and nothing after its blank line
    expect(JSON.parse(events[0]!.slice('data: '.length))).toEqual(vllmError);
  });

  it("puts an older vLLM's flat error body under `error`, as that vLLM wrote it in a stream", async () => {
    const flat =
      '{"object":"error","message":"too long","type":"BadRequestError","param":null,"code":400}';
    const text = await engineErrorAfterHead('flat', 400, [flat]);
    expect(text).toBe(`${before}data: {"error":${flat}}\n\ndata: [DONE]\n\n`);
  });

  it("answers a body that is not vLLM's error with Sluice's engine_error event", async () => {
    const text = await engineErrorAfterHead('proxy', 502, ['<html>Bad Gateway</html>']);
    const events = sseEvents(text);
    expect(events.at(-1)).toBe('[DONE]');
    expect(JSON.parse(events[0]!)).toEqual({
      error: {
        message: 'engine answered 502: <html>Bad Gateway</html>',
        type: 'server_error',
        param: null,
        code: 'engine_error',
      },
    });
  });

  it('holds no more of an error body than SLUICE_SLOW_CLIENT_BYTES, and says it was cut', async () => {
    const h = hooks({ slowClientBytes: 1024 });
    const message = 'x'.repeat(4096);
    const body = JSON.stringify({ error: { message, type: 'BadRequestError', code: 400 } });
    const text = await engineErrorAfterHead('huge', 400, [body.slice(0, 600), body.slice(600)], h);
    const error = (JSON.parse(sseEvents(text)[0]!) as { error: { message: string; code: string } })
      .error;
    expect(error.code).toBe('engine_error');
    expect(error.message).toBe(`engine answered 400: ${body.slice(0, 1024)}… (cut)`);
  });
});
