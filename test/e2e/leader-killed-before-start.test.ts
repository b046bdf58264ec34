// A leader SIGKILLed after releasing a non-streamed request but before its `start` frame went
// out (it goes with the engine's head or at the first liveness tick): the gateway still holds
// the client as queued. The standby's stalled check moves the job back with a deferred
// failure, and the standby fails it unrun, telling the client dispatcher_lost first. Before,
// it was failed without a word and deleted, and the gateway's parked watch answered 503
// queue_lost, a Redis fault, for a dispatcher's death. The engine ran the request once.
import { keySpace } from '@sluice/protocol';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  answer,
  chat,
  eventually,
  metricSum,
  queuedJobs,
  startStack,
  type Stack,
} from '../support/index.ts';

let stack: Stack;

beforeAll(async () => {
  stack = await startStack({
    // 3,000 tokens at 10 ms each: the answer is far from done when the leader dies.
    sim: ['--decode-seconds-per-sequence', '0.01'],
    env: {
      ADMISSION_MAX_INFLIGHT: '2',
      SLUICE_LEASE_TTL_MS: '1000',
      // No liveness tick before the kill, however slow the machine: the start frame goes out
      // only with the engine's head, which a non-streamed answer sends with its whole body.
      SLUICE_RELAY_LIVENESS_MS: '60000',
      SLUICE_RELAY_SILENCE_TIMEOUT_MS: '180000',
    },
    dispatcherIds: ['first', 'second'],
  });
});

afterAll(() => stack?.stop());

describe('a leader killed before a job has sent its start', () => {
  it('the client hears dispatcher_lost from the new leader, and the engine never runs the request again', async () => {
    const pending = answer(chat(stack.gateway.url, 'long', { max_tokens: 3000, ignore_eos: true }));
    await eventually(
      async () => ((await stack.sim.state()).running === 1 ? true : undefined),
      'the engine to run the request',
    );

    await stack.dispatchers[0]!.stop('SIGKILL');

    const a = await pending;
    expect(a.status, a.body).toBe(503);
    expect(a.reason, a.body).toBe('dispatcher_lost');
    expect(a.retryAfter).toBe('1');
    expect(JSON.parse(a.body)).toMatchObject({
      error: { code: 'dispatcher_lost', message: expect.stringMatching(/dispatcher .* died/) },
    });
    expect(
      await metricSum(stack.gateway.url, 'sluice_rejected_total', { reason: 'queue_lost' }),
    ).toBe(0);
    expect(
      await metricSum(stack.dispatchers[1]!.url, 'sluice_skipped_total', { reason: 'stalled' }),
    ).toBe(1);

    // Failed and deleted: nothing is left in Redis for a dispatcher to take again.
    const client = new Redis(stack.redis.url);
    expect(await client.get(keySpace().lease('default'))).toBe('second');
    expect(await queuedJobs(client)).toBe(0);
    expect(await client.llen(keySpace().queueKey('default', 'active'))).toBe(0);
    await client.quit();
    expect((await stack.sim.state()).receivedTotal).toBe(1);
  });
});
