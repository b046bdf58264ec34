// A held request fed through this replica's real reply channel (a real redis-server), with its
// cancels published on the real cancel channel: what a broken frame does to the client and to
// the engine request behind it.
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
  router = new ReplyRouter(subscriber, channel, 60_000, Date.now, (kind) => badFrames.push(kind));
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
