// Reply frames on a real Redis channel: order, sequence numbers, batching, liveness.
import { decodeFrame, type Frame } from '@sluice/protocol';
import { createRedis, redisReady, type Redis } from '@sluice/redis';
import { startRedis, type TestRedis } from '@sluice/test/support';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RelayHub } from '../src/relay.ts';

let server: TestRedis;
let publisher: Redis;
let subscriber: Redis;

beforeAll(async () => {
  server = await startRedis();
  publisher = createRedis(server.url, { name: 'pub', role: 'command' });
  subscriber = createRedis(server.url, { name: 'sub', role: 'subscriber' });
  await Promise.all([redisReady(publisher), redisReady(subscriber)]);
});
afterAll(async () => {
  await Promise.all([publisher.quit(), subscriber.quit()]);
  await server.stop();
});

/** Collects frames from `channel` until one of type `until` arrives. */
async function collect(
  channel: string,
  until: Frame['type'],
): Promise<{ frames: Frame[]; done: Promise<Frame[]> }> {
  const frames: Frame[] = [];
  let finish!: (f: Frame[]) => void;
  const done = new Promise<Frame[]>((r) => (finish = r));
  subscriber.on('messageBuffer', (ch: Buffer, message: Buffer) => {
    if (ch.toString() !== channel) return;
    const frame = decodeFrame(message);
    frames.push(frame);
    if (frame.type === until) finish(frames);
  });
  await subscriber.subscribe(channel);
  return { frames, done };
}

describe('reply relay', () => {
  it('sends start, head, data and end in order with consecutive sequence numbers, joining chunks written together', async () => {
    const { done } = await collect('c1', 'end');
    const hub = new RelayHub(publisher, 60_000, Date.now);
    const relay = hub.open('job1', 'c1');
    relay.start({ engine: 'e', loadState: 'normal' });
    relay.head({ status: 200, contentType: 'text/event-stream' });
    for (let i = 0; i < 100; i += 1) relay.data(Buffer.from(`data: ${i}\n\n`));
    relay.end();
    hub.close(relay);
    hub.stop();
    const frames = await done;
    expect(frames.map((f) => f.type)).toEqual(['start', 'head', 'data', 'end']);
    expect(frames.map((f) => f.seq)).toEqual([0, 1, 2, 3]);
    const data = frames[2]!;
    expect(data.type === 'data' && data.chunk.toString()).toBe(
      Array.from({ length: 100 }, (_, i) => `data: ${i}\n\n`).join(''),
    );
  });

  it('sends alive frames while a job is quiet, and none after it finished', async () => {
    const { frames, done } = await collect('c2', 'alive');
    const hub = new RelayHub(publisher, 50, Date.now);
    const relay = hub.open('job2', 'c2');
    relay.start({ engine: 'e', loadState: 'normal' });
    await done;
    expect(frames[0]!.type).toBe('start');
    expect(frames[1]).toMatchObject({ type: 'alive', jobId: 'job2', seq: 1 });
    relay.error({ status: 503, code: 'engine_unreachable', message: 'gone' });
    hub.close(relay);
    hub.stop();
  });
});
