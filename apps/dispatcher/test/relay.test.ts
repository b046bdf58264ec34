// Reply frames on a real Redis channel: order, sequence numbers, batching, liveness.
import { decodeFrame, messageFrames, type Frame } from '@sluice/protocol';
import { createRedis, redisReady, type Redis } from '@sluice/redis';
import { eventually, startRedis, type TestRedis } from '@sluice/test/support';
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

/**
 * Collects frames from `channel` until `count` frames of type `until` arrived, and how many
 * pub/sub messages carried them.
 */
async function collect(
  channel: string,
  until: Frame['type'],
  count = 1,
): Promise<{ frames: Frame[]; messages: () => number; done: Promise<Frame[]> }> {
  const frames: Frame[] = [];
  let messages = 0;
  let seen = 0;
  let finish!: (f: Frame[]) => void;
  const done = new Promise<Frame[]>((r) => (finish = r));
  subscriber.on('messageBuffer', (ch: Buffer, message: Buffer) => {
    if (ch.toString() !== channel) return;
    messages += 1;
    for (const frame of messageFrames(message).map(decodeFrame)) {
      frames.push(frame);
      if (frame.type === until && (seen += 1) === count) finish(frames);
    }
  });
  await subscriber.subscribe(channel);
  return { frames, messages: () => messages, done };
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

  it('keeps the start until the head and sends both in one message, saying how long it waited', async () => {
    const { frames, messages, done } = await collect('c5', 'end');
    let clock = 1000;
    const hub = new RelayHub(publisher, 60_000, () => clock);
    const relay = hub.open('job5', 'c5');
    relay.start({ engine: 'e', loadState: 'normal' });
    await hub.written();
    // A marker published after the start's turn arrives first: the start was not sent.
    await publisher.publish('c5', Buffer.from('A' + 'marker 0\n'));
    await eventually(() => frames.length === 1, 'the marker');
    clock = 1250;
    relay.head({ status: 200, contentType: 'text/event-stream' });
    await hub.written();
    relay.data(Buffer.from('data: x\n\n'));
    relay.end();
    hub.close(relay);
    hub.stop();
    const all = (await done).slice(1);
    expect(all.map((f) => f.type)).toEqual(['start', 'head', 'data', 'end']);
    expect(all.map((f) => f.seq)).toEqual([0, 1, 2, 3]);
    expect(all[0]).toMatchObject({ info: { engine: 'e', loadState: 'normal', sentAfterMs: 250 } });
    // The marker, start + head, data + end.
    expect(messages()).toBe(3);
  });

  it('sends a non-streaming answer as one message at its end, its body joined', async () => {
    const { messages, done } = await collect('c6', 'end');
    const hub = new RelayHub(publisher, 60_000, Date.now);
    const relay = hub.open('job6', 'c6', true);
    relay.start({ engine: 'e', loadState: 'normal' });
    relay.head({ status: 200, contentType: 'application/json' });
    for (const part of ['{"a":', '1', '}']) {
      await hub.written();
      relay.data(Buffer.from(part));
    }
    relay.end();
    hub.close(relay);
    hub.stop();
    const frames = await done;
    expect(frames.map((f) => f.type)).toEqual(['start', 'head', 'data', 'end']);
    const data = frames[2]!;
    expect(data.type === 'data' && data.chunk.toString()).toBe('{"a":1}');
    expect(messages()).toBe(1);
  });

  it('sends a start still kept on the liveness tick, then alive frames', async () => {
    const { frames, done } = await collect('c7', 'alive');
    let clock = 5000;
    const hub = new RelayHub(publisher, 50, () => clock);
    const relay = hub.open('job7', 'c7', true);
    relay.start({ engine: 'e', loadState: 'normal' });
    relay.head({ status: 200, contentType: 'application/json' });
    clock = 5080;
    await eventually(() => frames.length === 1, 'the start on the tick');
    expect(frames[0]).toMatchObject({ type: 'start', seq: 0, info: { sentAfterMs: 80 } });
    clock = 5200;
    await done;
    expect(frames[1]).toMatchObject({ type: 'alive', seq: 1 });
    relay.end();
    hub.close(relay);
    hub.stop();
  });

  it('sends alive frames while a job is quiet, and none after it finished', async () => {
    const { frames, done } = await collect('c2', 'alive');
    const hub = new RelayHub(publisher, 50, Date.now);
    const relay = hub.open('job2', 'c2');
    relay.start({ engine: 'e', loadState: 'normal' });
    await done;
    expect(frames[0]!.type).toBe('start');
    expect(frames[1]).toMatchObject({ type: 'alive', jobId: 'job2', seq: 1 });
    relay.error({ code: 'engine_unreachable', message: 'gone' });
    hub.close(relay);
    hub.stop();
  });

  it('sends the frames of every job for one replica made in one turn as one message, in order', async () => {
    const { done, messages } = await collect('c3', 'end', 10);
    const other = await collect('c4', 'end');
    const hub = new RelayHub(publisher, 60_000, Date.now);
    const relays = Array.from({ length: 10 }, (_, i) => hub.open(`job-${i}`, 'c3'));
    const elsewhere = hub.open('job-x', 'c4');
    for (const relay of [...relays, elsewhere]) {
      relay.start({ engine: 'e', loadState: 'normal' });
      relay.head({ status: 200, contentType: 'application/json' });
      relay.data(Buffer.from(`{"job":"${relay.jobId}"}`));
      relay.end();
      hub.close(relay);
    }
    hub.stop();
    const frames = await done;
    expect(messages()).toBe(1);
    expect(frames).toHaveLength(40);
    for (let i = 0; i < 10; i += 1) {
      const own = frames.filter((f) => f.jobId === `job-${i}`);
      expect(own.map((f) => `${f.type}${f.seq}`)).toEqual(['start0', 'head1', 'data2', 'end3']);
    }
    expect((await other.done).map((f) => f.jobId)).toEqual(['job-x', 'job-x', 'job-x', 'job-x']);
  });

  it('splits a turn of more than a megabyte for one replica into several messages', async () => {
    const { done, messages } = await collect('c5', 'end', 3);
    const hub = new RelayHub(publisher, 60_000, Date.now);
    for (let i = 0; i < 3; i += 1) {
      const relay = hub.open(`big-${i}`, 'c5');
      relay.head({ status: 200, contentType: 'application/json' });
      relay.data(Buffer.alloc(600 * 1024, 0x61));
      relay.end();
      hub.close(relay);
    }
    hub.stop();
    const frames = await done;
    expect(messages()).toBe(3);
    expect(frames.map((f) => `${f.jobId} ${f.type}`)).toEqual(
      [0, 1, 2].flatMap((i) => [`big-${i} head`, `big-${i} data`, `big-${i} end`]),
    );
  });
});
