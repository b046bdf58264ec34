// Reply frames on a real Redis channel: order, sequence numbers, batching, liveness.
import { decodeFrame, messageFrames, type Frame } from '@sluice/protocol';
import { createRedis, redisReady, type Redis } from '@sluice/redis';
import { eventually, startRedis, type TestRedis } from '@sluice/test/support';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { MAX_DATA_FRAME_BYTES, RelayHub } from '../src/relay.ts';

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
): Promise<{
  frames: Frame[];
  messages: () => number;
  /** The size of each message, in bytes, in order. */
  sizes: number[];
  done: Promise<Frame[]>;
}> {
  const frames: Frame[] = [];
  const sizes: number[] = [];
  let messages = 0;
  let seen = 0;
  let finish!: (f: Frame[]) => void;
  const done = new Promise<Frame[]>((r) => (finish = r));
  const listener = (ch: Buffer, message: Buffer) => {
    if (ch.toString() !== channel) return;
    messages += 1;
    sizes.push(message.length);
    for (const frame of messageFrames(message).map(decodeFrame)) {
      frames.push(frame);
      if (frame.type === until && (seen += 1) === count) {
        subscriber.off('messageBuffer', listener);
        finish(frames);
      }
    }
  };
  subscriber.on('messageBuffer', listener);
  await subscriber.subscribe(channel);
  return { frames, messages: () => messages, sizes, done };
}

/** The body bytes of the data frames, joined. */
const body = (frames: Frame[]) =>
  Buffer.concat(frames.flatMap((f) => (f.type === 'data' ? [f.chunk] : [])));

/** `n` bytes that differ along the way, so a part out of order or lost shows. */
const bytes = (n: number, seed = 0) => {
  const out = Buffer.allocUnsafe(n);
  for (let i = 0; i < n; i += 1) out[i] = (i * 7 + seed) % 251;
  return out;
};

/** Largest message the hub sends for frames of at most MAX_DATA_FRAME_BYTES: one bundle. */
const BUNDLE_LIMIT = 1024 * 1024 + 1024;

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
    const { done, messages } = await collect('c8', 'end', 6);
    const hub = new RelayHub(publisher, 60_000, Date.now);
    for (let i = 0; i < 6; i += 1) {
      const relay = hub.open(`big-${i}`, 'c8');
      relay.head({ status: 200, contentType: 'application/json' });
      relay.data(Buffer.alloc(200 * 1024, 0x61));
      relay.end();
      hub.close(relay);
    }
    hub.stop();
    const frames = await done;
    // Five jobs' frames fill the first megabyte; the sixth job's data starts the second.
    expect(messages()).toBe(2);
    expect(frames.map((f) => `${f.jobId} ${f.type}`)).toEqual(
      [0, 1, 2, 3, 4, 5].flatMap((i) => [`big-${i} head`, `big-${i} data`, `big-${i} end`]),
    );
  });

  it('splits a stream turn, and a chunk, larger than a data frame into frames of at most its size', async () => {
    const { done, sizes } = await collect('c9', 'end');
    const hub = new RelayHub(publisher, 60_000, Date.now);
    const relay = hub.open('split', 'c9');
    relay.head({ status: 200, contentType: 'text/event-stream' });
    const sent = [
      bytes(100),
      bytes(2 * MAX_DATA_FRAME_BYTES + 10, 1),
      bytes(MAX_DATA_FRAME_BYTES, 2),
    ];
    for (const chunk of sent) relay.data(chunk);
    relay.end();
    hub.close(relay);
    hub.stop();
    const frames = await done;
    const data = frames.filter((f) => f.type === 'data');
    expect(data.map((f) => f.chunk.length)).toEqual([
      MAX_DATA_FRAME_BYTES,
      MAX_DATA_FRAME_BYTES,
      MAX_DATA_FRAME_BYTES,
      110,
    ]);
    expect(frames.map((f) => f.seq)).toEqual([0, 1, 2, 3, 4, 5]);
    expect(body(frames).equals(Buffer.concat(sent))).toBe(true);
    for (const size of sizes) expect(size).toBeLessThanOrEqual(BUNDLE_LIMIT);
  });

  it('sends a non-streaming answer that outgrows one data frame as a stream: head first, then bounded frames', async () => {
    const { frames, sizes, done } = await collect('c10', 'end');
    const hub = new RelayHub(publisher, 60_000, Date.now);
    const relay = hub.open('whole-big', 'c10', true);
    relay.start({ engine: 'e', loadState: 'normal' });
    relay.head({ status: 200, contentType: 'application/json' });
    // What undici hands over for a 3 MB answer: socket-sized chunks, and one large one.
    const sent = [
      ...Array.from({ length: 8 }, (_, i) => bytes(64 * 1024, i)),
      bytes(2 * 1024 * 1024 + 3, 9),
    ];
    for (const chunk of sent.slice(0, 5)) {
      relay.data(chunk);
      await hub.written();
    }
    // Past one frame's worth the head and the body so far go out before the answer's end.
    await eventually(() => frames.some((f) => f.type === 'data'), 'data before the end');
    expect(frames.slice(0, 2).map((f) => f.type)).toEqual(['start', 'head']);
    for (const chunk of sent.slice(5)) relay.data(chunk);
    relay.end();
    hub.close(relay);
    hub.stop();
    await done;
    expect(frames.map((f) => f.seq)).toEqual(frames.map((_, i) => i));
    expect(frames.at(-1)!.type).toBe('end');
    const data = frames.filter((f) => f.type === 'data');
    expect(data.length).toBeGreaterThan(8);
    for (const f of data) expect(f.chunk.length).toBeLessThanOrEqual(MAX_DATA_FRAME_BYTES);
    expect(body(frames).equals(Buffer.concat(sent))).toBe(true);
    for (const size of sizes) expect(size).toBeLessThanOrEqual(BUNDLE_LIMIT);
  });

  it('still sends a non-streaming answer of exactly one data frame as one message', async () => {
    const { messages, done } = await collect('c11', 'end');
    const hub = new RelayHub(publisher, 60_000, Date.now);
    const relay = hub.open('whole-edge', 'c11', true);
    relay.start({ engine: 'e', loadState: 'normal' });
    relay.head({ status: 200, contentType: 'application/json' });
    const sent = Array.from({ length: 4 }, (_, i) => bytes(MAX_DATA_FRAME_BYTES / 4, i));
    for (const chunk of sent) {
      relay.data(chunk);
      await hub.written();
    }
    relay.end();
    hub.close(relay);
    hub.stop();
    const frames = await done;
    expect(frames.map((f) => f.type)).toEqual(['start', 'head', 'data', 'end']);
    expect(body(frames).equals(Buffer.concat(sent))).toBe(true);
    expect(messages()).toBe(1);
  });

  it('drops a kept head and partial body at an error, so the gateway can still answer its status', async () => {
    const { frames, messages, done } = await collect('c12', 'error');
    const hub = new RelayHub(publisher, 60_000, Date.now);
    const relay = hub.open('whole-broken', 'c12', true);
    relay.start({ engine: 'e', loadState: 'normal' });
    relay.head({ status: 200, contentType: 'application/json' });
    relay.data(Buffer.from('{"id":"cmpl-1","choices":[{"mess'));
    relay.error({
      code: 'engine_error',
      message: 'engine e failed mid-response: other side closed',
    });
    hub.close(relay);
    hub.stop();
    await done;
    expect(frames).toEqual([
      {
        type: 'start',
        jobId: 'whole-broken',
        seq: 0,
        info: expect.objectContaining({ engine: 'e' }),
      },
      {
        type: 'error',
        jobId: 'whole-broken',
        seq: 1,
        info: { code: 'engine_error', message: 'engine e failed mid-response: other side closed' },
      },
    ]);
    expect(messages()).toBe(1);
  });

  it('ends a non-streaming answer already sent as a stream with the error after what went out', async () => {
    const { frames, done } = await collect('c13', 'error');
    const hub = new RelayHub(publisher, 60_000, Date.now);
    const relay = hub.open('whole-big-broken', 'c13', true);
    relay.start({ engine: 'e', loadState: 'normal' });
    relay.head({ status: 200, contentType: 'application/json' });
    relay.data(bytes(MAX_DATA_FRAME_BYTES + 1));
    relay.error({ code: 'engine_error', message: 'cut' });
    hub.close(relay);
    hub.stop();
    await done;
    expect(frames.map((f) => f.type)).toEqual(['start', 'head', 'data', 'data', 'error']);
  });
});
