// A job whose data is not JSON, in front of a pool of cap 1, as the reviewer made one: its
// BullMQ hash's `data` cut short. BullMQ makes a job active before it parses the data, so
// such a job used to hold the pool's one slot for good (taken, thrown on, put back by the
// stalled check, taken again) and every later request waited out its park limit. It is failed
// like any invalid payload now, and the requests behind it are served; a client whose own job
// it was hears that its job is gone.
import { decodePoolStats, keySpace, QUEUE_EVENTS_MAX_LEN, type PoolMode } from '@sluice/protocol';
import { Queue } from 'bullmq';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { answer, chat, eventually, startStack, untilReady, type Stack } from '../support/index.ts';

const keys = keySpace('sluice');
let stack: Stack;
let client: Redis;
let queue: Queue;

beforeAll(async () => {
  stack = await startStack({
    env: { ADMISSION_MAX_INFLIGHT: '1', ADMISSION_MAX_PARK_SECONDS: '10' },
  });
  client = new Redis(stack.redis.url);
  queue = new Queue(keys.queueName('default'), {
    connection: client,
    prefix: keys.prefix,
    streams: { events: { maxLen: QUEUE_EVENTS_MAX_LEN } },
  });
  await untilReady(stack.gateway);
});

afterAll(async () => {
  await queue?.close();
  await client?.quit();
  await stack?.stop();
});

/** The value of the dispatcher's first series named `name` that carries `label`. */
async function dispatcherMetric(name: string, label: string): Promise<number | undefined> {
  const text = await (await fetch(`${stack.dispatcher.url}/metrics`)).text();
  const line = text.split('\n').find((l) => l.startsWith(`${name}{`) && l.includes(label));
  return line === undefined ? undefined : Number(line.split(' ').pop());
}

const skippedInvalid = () => dispatcherMetric('sluice_skipped_total', 'reason="invalid_payload"');

/** Sets the pool's mode as `sluice pool` does, and waits for the leader to show it. */
async function setMode(mode: PoolMode): Promise<void> {
  const before = (await client.get(keys.poolStats('default'))) ?? '';
  if (mode === 'open') await client.del(keys.poolControl('default'));
  else await client.set(keys.poolControl('default'), mode);
  await client.publish(keys.controlChannel, 'default');
  await eventually(async () => {
    const text = await client.get(keys.poolStats('default'));
    if (!text || text === before) return undefined;
    try {
      return decodePoolStats(text).mode === mode ? true : undefined;
    } catch {
      return undefined; // read while being replaced: the next snapshot tells
    }
  }, `the leader to show the pool ${mode}`);
}

describe('a job whose data is not JSON', () => {
  it('is failed and counted, and the requests behind it are served at cap 1', async () => {
    // Added delayed so that no take gets it before its data is cut, then promoted to the queue.
    const job = await queue.add('completion', {}, { jobId: 'bad-1', delay: 600_000 });
    await client.hset(queue.toKey('bad-1'), 'data', '{"v":1,"trunc');
    await job.promote();
    for (let i = 0; i < 3; i += 1) {
      const res = await answer(
        chat(stack.gateway.url, `after the bad job ${i}`, { max_tokens: 2 }),
      );
      expect(res.status, res.body).toBe(200);
    }
    expect(await queue.getJobState('bad-1')).toBe('failed');
    expect(await client.hget(queue.toKey('bad-1'), 'failedReason')).toBe('invalid_payload');
    expect(await eventually(skippedInvalid, 'the discarded job to be counted')).toBe(1);
  });

  it("answers its client 503 queue_lost when it was a gateway's job, and the pool goes on", async () => {
    const skippedBefore = (await skippedInvalid()) ?? 0;
    // The reviewer's order: paused, the job queued and cut, then resumed.
    await setMode('paused');
    // The release loop has ended: no take blocked since before the pause gets the job.
    await eventually(
      async () =>
        (await dispatcherMetric('sluice_gate_open', 'pool="default"')) === 0 ? true : undefined,
      'the release loop to stop',
    );
    const pending = answer(chat(stack.gateway.url, 'my job will be cut', { max_tokens: 2 }));
    const [jobId] = await eventually(async () => {
      const ids = await client.zrange(keys.queueKey('default', 'prioritized'), 0, -1);
      return ids.length === 1 ? ids : undefined;
    }, 'the request to be queued');
    await client.hset(queue.toKey(jobId!), 'data', '{"v":1,"trunc');
    await setMode('open');
    const res = await pending;
    expect(res.status, res.body).toBe(503);
    expect(res.reason).toBe('queue_lost');
    expect(await client.exists(queue.toKey(jobId!))).toBe(0);
    expect(await eventually(skippedInvalid, 'the discarded job to be counted')).toBe(
      skippedBefore + 1,
    );
    const next = await answer(chat(stack.gateway.url, 'after the cut job', { max_tokens: 2 }));
    expect(next.status, next.body).toBe(200);
  });
});

// BullMQ parses more of a job's hash than its data when it takes one (`rawToJobJson` in
// bullmq's redis-queue-backend.js: `opts`, `progress`, `parent`), before any of Sluice's code
// sees it, and its completion script decodes `parent` again in Lua.
describe.each(['opts', 'progress', 'parent'])('a job whose %s is not JSON', (field) => {
  it('is failed and counted, and the requests behind it are served at cap 1', async () => {
    const skippedBefore = (await skippedInvalid()) ?? 0;
    const jobId = `bad-${field}`;
    const job = await queue.add('completion', {}, { jobId, delay: 600_000 });
    await client.hset(queue.toKey(jobId), field, '{"cut');
    await job.promote();
    for (let i = 0; i < 2; i += 1) {
      const res = await answer(
        chat(stack.gateway.url, `after bad ${field} ${i}`, { max_tokens: 2 }),
      );
      expect(res.status, res.body).toBe(200);
    }
    expect(await queue.getJobState(jobId)).toBe('failed');
    expect(await client.hget(queue.toKey(jobId), 'failedReason')).toBe('invalid_payload');
    expect(
      await eventually(async () => {
        const n = await skippedInvalid();
        return n !== undefined && n > skippedBefore ? n : undefined;
      }, 'the discarded job to be counted'),
    ).toBe(skippedBefore + 1);
  });
});
