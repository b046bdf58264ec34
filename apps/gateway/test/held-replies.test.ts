// A held request fed through this replica's real reply channel (a real redis-server), with its
// cancels published on the real cancel channel: what a broken frame does to the client and to
// the engine request behind it, and that a hostile one ends its own request, not the replica.
import { once } from 'node:events';
import { createServer, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { encodeFrame, keySpace, type Frame } from '@sluice/protocol';
import { createRedis, redisReady, type Redis } from '@sluice/redis';
import { startRedis, type TestRedis } from '@sluice/test/support';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { cancelPublisher } from '../src/cancels.ts';
import { HeldRequest, type HeldRequestHooks } from '../src/held-request.ts';
import { ReplyRouter } from '../src/replies.ts';

const keys = keySpace('sluice');
const channel = keys.replyChannel('gw');

let server: TestRedis;
let publisher: Redis;
let subscriber: Redis;
let listener: Redis;
let router: ReplyRouter;
let http: Server;
let port: number;
let nextResponse: ((res: ServerResponse) => void) | undefined;
const badFrames: string[] = [];
/** Every message on the cancel channel, and who waits for the next one. */
const cancels: string[] = [];
let onCancel: (() => void) | undefined;

beforeAll(async () => {
  server = await startRedis();
  publisher = createRedis(server.url, { name: 'pub', role: 'command' });
  subscriber = createRedis(server.url, { name: 'replies', role: 'subscriber' });
  listener = createRedis(server.url, { name: 'dispatcher', role: 'subscriber' });
  await Promise.all([redisReady(publisher), redisReady(subscriber), redisReady(listener)]);
  router = new ReplyRouter(
    subscriber,
    channel,
    60_000,
    Date.now,
    (kind) => badFrames.push(kind),
    cancelPublisher(publisher, keys.cancelChannel, {
      onGiveUp: (_jobId, err) => {
        throw err;
      },
    }),
  );
  await router.start();
  listener.on('message', (_channel: string, message: string) => {
    cancels.push(message);
    onCancel?.();
  });
  await listener.subscribe(keys.cancelChannel);
  http = createServer((_req, res) => {
    res.shouldKeepAlive = false;
    nextResponse?.(res);
  });
  http.listen(0, '127.0.0.1');
  await once(http, 'listening');
  port = (http.address() as AddressInfo).port;
});

afterAll(async () => {
  router.stop();
  http.close();
  await Promise.all([publisher.quit(), subscriber.quit(), listener.quit()]);
  await server.stop();
});

function hooks(): HeldRequestHooks {
  return {
    heartbeatMs: 60_000,
    maxParkMs: 60_000,
    slowClientBytes: 1024 ** 3,
    slowClientStallMs: 60_000,
    engineDetails: true,
    now: Date.now,
    removeQueued: async () => 'taken',
    jobKey: (jobId) => jobId,
    cancel: cancelPublisher(publisher, keys.cancelChannel, {
      onGiveUp: (_jobId, err) => {
        throw err;
      },
    }),
    retryAfter: async () => 1,
    onHeartbeat: () => {},
    onStarted: () => {},
    onFirstByte: () => {},
    onRefused: () => {},
    onDone: (held) => router.forget(held.jobId),
  };
}

/** Everything published on the cancel channel up to now: a marker sent after it comes last. */
async function cancelsSoFar(): Promise<string[]> {
  const marker = `marker-${cancels.length} -`;
  const heard = new Promise<void>((resolve) => {
    onCancel = () => {
      if (cancels.at(-1) === marker) resolve();
    };
  });
  // The cancel publisher writes on the same connection: Redis delivers in the order sent.
  await publisher.publish(keys.cancelChannel, marker);
  await heard;
  return cancels.splice(0).filter((m) => m !== marker);
}

describe('a broken reply frame', () => {
  it('ends the stream frame_lost and cancels the engine request when a frame cannot be decoded', async () => {
    const served = new Promise<ServerResponse>((resolve) => (nextResponse = resolve));
    const answer = fetch(`http://127.0.0.1:${port}/`, { method: 'POST', body: '{}' });
    const held = new HeldRequest('j1', 'm', true, Date.now(), Date.now(), await served, hooks());
    held.hold();
    router.held.set('j1', held);
    const frames: Frame[] = [
      { type: 'start', jobId: 'j1', seq: 0, info: { engine: 'e', loadState: 'normal' } },
      {
        type: 'head',
        jobId: 'j1',
        seq: 1,
        info: { status: 200, contentType: 'text/event-stream' },
      },
      { type: 'data', jobId: 'j1', seq: 2, chunk: Buffer.from('data: {"n":1}\n\n') },
    ];
    for (const f of frames) await publisher.publish(channel, encodeFrame(f));
    // What the reviewer published: a head frame whose payload is not JSON.
    await publisher.publish(channel, Buffer.from('Hj1 9999\n{not json'));
    const text = await (await answer).text();
    expect(text).toMatch(
      /^data: \{"n":1\}\n\ndata: \{"error":.*"code":"frame_lost".*\}\n\ndata: \[DONE\]\n\n$/,
    );
    expect(held.reason).toBe('frame_lost');
    expect(badFrames).toEqual(['undecodable']);
    expect(await cancelsSoFar()).toEqual(['j1 frame_lost']);
    expect(router.held.size).toBe(0);
  });
});

/** A request held by this replica, as the completion route holds one, and its answer. */
async function held(
  jobId: string,
  make: (res: ServerResponse) => HeldRequest = (res) =>
    new HeldRequest(jobId, 'm', false, Date.now(), Date.now(), res, hooks()),
): Promise<{ request: HeldRequest; answer: Promise<Response> }> {
  const served = new Promise<ServerResponse>((resolve) => (nextResponse = resolve));
  const answer = fetch(`http://127.0.0.1:${port}/`, { method: 'POST', body: '{}' });
  const request = make(await served);
  request.hold();
  router.held.set(jobId, request);
  return { request, answer };
}

/** Publishes a whole non-streamed answer for `jobId` from its frame `seq` on. */
async function serve(jobId: string, seq: number, body: string): Promise<void> {
  const frames: Frame[] = [
    { type: 'head', jobId, seq, info: { status: 200, contentType: 'application/json' } },
    { type: 'data', jobId, seq: seq + 1, chunk: Buffer.from(body) },
    { type: 'end', jobId, seq: seq + 2 },
  ];
  for (const f of frames) await publisher.publish(channel, encodeFrame(f));
}

const start = (jobId: string): Frame => ({
  type: 'start',
  jobId,
  seq: 0,
  info: { engine: 'e', loadState: 'normal' },
});

describe('a hostile reply frame', () => {
  it('ends only its own request, and the replica goes on serving the others', async () => {
    badFrames.length = 0;
    const hostile = await held('h1');
    const other = await held('h2');
    for (const id of ['h1', 'h2']) await publisher.publish(channel, encodeFrame(start(id)));
    // What the reviewer published: a head whose status Node's writeHead throws on.
    await publisher.publish(
      channel,
      Buffer.from('Hh1 1\n{"status":1000,"contentType":"application/json"}'),
    );
    await serve('h2', 1, '{"ok":true}');
    const refused = await hostile.answer;
    expect(refused.status).toBe(502);
    expect(refused.headers.get('x-sluice-reject-reason')).toBe('frame_lost');
    expect(await refused.text()).toMatch(/field status must be an integer from 200 to 999/);
    const served = await other.answer;
    expect(served.status).toBe(200);
    expect(await served.text()).toBe('{"ok":true}');
    expect(badFrames).toEqual(['undecodable']);
    expect(await cancelsSoFar()).toEqual(['h1 frame_lost']);
    expect(router.held.size).toBe(0);
  });

  it('ends its request as broken when applying a frame throws anything, not only a ProtocolError', async () => {
    badFrames.length = 0;
    // Whatever decodeFrame may miss: writing the frame throws, as writeHead did.
    class Throwing extends HeldRequest {
      override onFrame(frame: Frame): void {
        if (frame.type === 'head') throw new RangeError('writeHead refused the head');
        super.onFrame(frame);
      }
    }
    const throwing = await held(
      't1',
      (res) => new Throwing('t1', 'm', false, Date.now(), Date.now(), res, hooks()),
    );
    const other = await held('t2');
    for (const id of ['t1', 't2']) await publisher.publish(channel, encodeFrame(start(id)));
    await serve('t1', 1, '{"never":"sent"}');
    await serve('t2', 1, '{"ok":true}');
    const refused = await throwing.answer;
    expect(refused.status).toBe(502);
    expect(refused.headers.get('x-sluice-reject-reason')).toBe('frame_lost');
    expect(await refused.text()).toMatch(/writeHead refused the head/);
    const served = await other.answer;
    expect(served.status).toBe(200);
    expect(await served.text()).toBe('{"ok":true}');
    // The frames after the one that threw belong to a request that has ended.
    expect(badFrames).toEqual(['undecodable', 'unknown_job', 'unknown_job']);
    expect(await cancelsSoFar()).toEqual(['t1 frame_lost']);
    expect(router.held.size).toBe(0);
  });
});

/** Resolves once `message` has come on the cancel channel. */
function cancelHeard(message: string): Promise<void> {
  return new Promise((resolve) => {
    onCancel = () => {
      if (cancels.includes(message)) resolve();
    };
  });
}

describe('frames of a job this replica does not hold', () => {
  it('cancels the job once, at its first frame that goes on: nothing here waits for it', async () => {
    badFrames.length = 0;
    cancels.length = 0;
    // What a process restarted on a dead one's channel gets: the dead one's job, running.
    const first = cancelHeard('o1 orphaned');
    await publisher.publish(channel, encodeFrame(start('o1')));
    await first;
    const frames: Frame[] = [
      { type: 'head', jobId: 'o1', seq: 1, info: { status: 200, contentType: 'x' } },
      { type: 'data', jobId: 'o1', seq: 2, chunk: Buffer.from('data: {"n":1}\n\n') },
    ];
    for (const f of frames) await publisher.publish(channel, encodeFrame(f));
    // Frames are read in the order published: once the next orphan's cancel comes, o1's
    // later frames have been read.
    const next = cancelHeard('o2 orphaned');
    await publisher.publish(channel, encodeFrame(start('o2')));
    await next;
    expect(await cancelsSoFar()).toEqual(['o1 orphaned', 'o2 orphaned']);
    expect(badFrames).toEqual(['unknown_job', 'unknown_job', 'unknown_job', 'unknown_job']);
  });

  it('cancels nothing for a job that is over (its end or error frame), nor for one that ended here', async () => {
    badFrames.length = 0;
    cancels.length = 0;
    // One this replica held and answered: its late frames need nothing more.
    const answered = await held('a1');
    await publisher.publish(channel, encodeFrame(start('a1')));
    await serve('a1', 1, '{"ok":true}');
    expect(await (await answered.answer).text()).toBe('{"ok":true}');
    await publisher.publish(channel, encodeFrame({ type: 'alive', jobId: 'a1', seq: 4 }));
    await publisher.publish(channel, encodeFrame({ type: 'end', jobId: 'e1', seq: 7 }));
    const info = { code: 'engine_error' as const, message: 'gone' };
    await publisher.publish(channel, encodeFrame({ type: 'error', jobId: 'x1', seq: 3, info }));
    const marker = cancelHeard('o3 orphaned');
    await publisher.publish(channel, encodeFrame(start('o3')));
    await marker;
    expect(await cancelsSoFar()).toEqual(['o3 orphaned']);
    expect(badFrames).toEqual(['unknown_job', 'unknown_job', 'unknown_job', 'unknown_job']);
  });
});
