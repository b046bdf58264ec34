// A Redis that freezes (SIGSTOP, or a partition: the sockets stay open and nothing answers)
// under held clients: one stream running on the engine, a JSON client and a streaming client
// queued behind it (cap 1). Nothing closes, so only the gateway's PING probe can tell; a
// Redis silent past SLUICE_REDIS_LOSS_GRACE_SECONDS is lost for the held clients as a closed
// connection is. The queued clients get 503 redis_unavailable with Retry-After, not a wait to
// the park limit (600 s here, far past the test's time-out), the running stream an in-band
// redis_unavailable (not dispatcher_lost), and after SIGCONT the stack serves by itself.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  alive,
  answer,
  chat,
  streamStarted,
  eventually,
  metricSum,
  startStack,
  untilReady,
  type Stack,
} from '../support/index.ts';

let stack: Stack;

beforeAll(async () => {
  stack = await startStack({
    // 20 ms a token: a stream of 100,000 tokens outlasts the test by far.
    sim: ['--max-num-seqs', '64', '--decode-seconds-per-sequence', '0.02'],
    env: {
      ADMISSION_MAX_INFLIGHT: '1',
      ADMISSION_MAX_PARK_SECONDS: '600',
      // The queued stream's head is not committed by a keep-alive meanwhile: it gets a 503.
      SSE_HEARTBEAT_SECONDS: '600',
      SLUICE_DEGRADATION: 'off',
      NODE_OPTIONS: '--unhandled-rejections=strict',
    },
  });
  await untilReady(stack.gateway);
});

afterAll(async () => {
  stack?.redis.process.child.kill('SIGCONT');
  await stack?.stop();
});

/** Opens a stream and resolves once its first event arrived, with the rest of it to come. */
async function openStream(base: string) {
  const res = await chat(base, 'running', { stream: true, max_tokens: 100_000, ignore_eos: true });
  expect(res.status).toBe(200);
  return streamStarted(res);
}

/** The error a failed stream ends with, before vLLM's closing `data: [DONE]`. */
const lastEvent = (text: string) => {
  const events = text.split('\n').filter((l) => l.startsWith('data: '));
  expect(events.at(-1)).toBe('data: [DONE]');
  const last = events.at(-2)!;
  expect(last).toMatch(/^data: \{"error":/);
  return JSON.parse(last.slice('data: '.length)) as { error: { code: string; message: string } };
};

describe('Redis frozen under held clients', () => {
  it('answers every held client redis_unavailable, and serves again after SIGCONT', async () => {
    const { gateway, sim, redis, dispatcher } = stack;
    const running = await openStream(gateway.url);
    await eventually(async () => (await sim.state()).running === 1, 'the stream on the engine');
    const queuedJson = answer(chat(gateway.url, 'queued json', { max_tokens: 4 }));
    const queuedStream = answer(
      chat(gateway.url, 'queued stream', { stream: true, max_tokens: 4 }),
    );
    await eventually(
      async () => (await metricSum(gateway.url, 'sluice_parked_requests')) === 2,
      'two clients queued behind the stream',
    );

    redis.process.child.kill('SIGSTOP');

    // The queued clients: refused, with a reason and a time to come back, by the loss.
    for (const [what, a] of [
      ['json', await queuedJson],
      ['stream', await queuedStream],
    ] as const) {
      expect(a.status, `${what}: ${a.body}`).toBe(503);
      expect(a.reason, what).toBe('redis_unavailable');
      expect(Number(a.retryAfter), what).toBeGreaterThanOrEqual(1);
      const error = (JSON.parse(a.body) as { error: { code: string; message: string } }).error;
      expect(error.code).toBe('redis_unavailable');
      // Not the park limit's answer (its removal timing out says "does not answer").
      expect(error.message).toContain('the request was not completed');
    }
    // The running stream: an in-band error with the true cause.
    expect(lastEvent(await running.rest).error.code).toBe('redis_unavailable');
    // The probe saw it; nothing closed.
    await gateway.process.waitForLine(/redis not answering past the grace period/);
    expect(await metricSum(gateway.url, 'sluice_held_requests')).toBe(0);

    redis.process.child.kill('SIGCONT');

    const served = await eventually(async () => {
      const a = await answer(chat(gateway.url, 'after SIGCONT', { max_tokens: 4 }));
      return a.status === 200 ? a : undefined;
    }, 'a request to be served after SIGCONT');
    expect(served.body).toContain('"choices"');

    // Nothing runs for nobody, the cap held, nothing crashed.
    await eventually(
      async () => ((await sim.state()).running === 0 ? true : undefined),
      'the engine to run nothing',
    );
    expect((await sim.state()).peakRequests).toBeLessThanOrEqual(1);
    const metrics = await (await fetch(`${gateway.url}/metrics`)).text();
    // The series exist from the start at 0 (primeRejected): none of them counted anything.
    expect(metrics).not.toMatch(
      /reason="(internal_error|dispatcher_lost|park_timeout)"[^}]*\} [1-9]/,
    );
    expect(alive(gateway)).toBe(true);
    expect(alive(dispatcher)).toBe(true);
  });
});
