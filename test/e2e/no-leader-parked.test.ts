// A pool that loses its last dispatcher (SIGTERM, no standby) while clients are queued. New
// requests are refused 503 no_leader within seconds; the queued ones used to wait their whole
// park limit for a queue nobody releases and then hear park_timeout ("no capacity"). The
// gateway's parked check now takes their jobs back once the lease has been missing past the
// hand-over grace and answers them no_leader too: 503 + Retry-After, or in-band on a stream
// whose head went out with a keep-alive. The running request is left to finish, and a
// dispatcher that comes back never runs the jobs taken back.
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  answer,
  chat,
  eventually,
  queuedJobs,
  startDispatcher,
  startStack,
  streamStarted,
  untilReady,
  type SluiceProcess,
  type Stack,
} from '../support/index.ts';

let stack: Stack;
let client: Redis;
let comeback: SluiceProcess | undefined;

beforeAll(async () => {
  // Slow decode: the blocking stream keeps the only slot until its client goes away. The park
  // limit is short so that, were the queued clients held to it, they would hear park_timeout
  // (the defect) well within the test's time.
  stack = await startStack({
    sim: ['--max-num-seqs', '64', '--decode-seconds-per-sequence', '0.01'],
    env: {
      ADMISSION_MAX_INFLIGHT: '1',
      ADMISSION_MAX_PARK_SECONDS: '20',
      SSE_HEARTBEAT_SECONDS: '0.2',
    },
  });
  client = new Redis(stack.redis.url);
  await untilReady(stack.gateway);
});

afterAll(async () => {
  await client?.quit();
  await comeback?.stop();
  await stack?.stop();
});

const url = () => stack.gateway.url;

describe('a pool loses its last dispatcher with clients queued', () => {
  it('answers the queued clients 503 no_leader (in-band on a started stream), not park_timeout; the running one goes on; a dispatcher back later never runs them', async () => {
    const blockerCut = new AbortController();
    const blocker = await chat(
      url(),
      'blocker',
      { stream: true, max_tokens: 100_000, ignore_eos: true },
      blockerCut.signal,
    );
    const { rest } = await streamStarted(blocker);
    let blockerEnded = false;
    void rest.then(
      () => (blockerEnded = true),
      () => (blockerEnded = true),
    );

    // Behind it: a stream (its head goes out with its first keep-alive) and a plain request.
    const queuedStream = await chat(url(), 'queued stream', { stream: true, max_tokens: 4 });
    expect(queuedStream.status).toBe(200);
    const queuedPlain = answer(chat(url(), 'queued plain', { max_tokens: 4 }));
    await eventually(
      async () => ((await queuedJobs(client)) === 2 ? true : undefined),
      'both queued',
    );

    // The only dispatcher goes: it hands the lease over to nobody and waits for the blocker.
    const leaderGone = stack.dispatcher.stop('SIGTERM');
    await stack.dispatcher.process.waitForLine(/lease handed over: closing/);

    const plain = await queuedPlain;
    expect(plain.reason).toBe('no_leader');
    expect(plain.status).toBe(503);
    expect(Number(plain.retryAfter)).toBeGreaterThanOrEqual(1);
    const events = await queuedStream.text();
    expect(events).toMatch(
      /data: \{"error":\{"message":"no dispatcher is leading pool default","type":"server_error","param":null,"code":"no_leader"\}\}\n\ndata: \[DONE\]\n\n$/,
    );
    expect(events).not.toContain('park_timeout');
    // Their jobs left the queue; the running request was not touched.
    expect(await queuedJobs(client)).toBe(0);
    expect(blockerEnded).toBe(false);
    expect((await stack.sim.state()).running).toBe(1);
    // A new request meanwhile gets the same answer.
    const fresh = await answer(chat(url(), 'fresh', { max_tokens: 4 }));
    expect(fresh.reason).toBe('no_leader');

    // The blocker's client leaves, the old dispatcher ends; a new one leads.
    blockerCut.abort();
    await leaderGone;
    comeback = await startDispatcher(stack.env);
    await untilReady(stack.gateway);
    const probe = await answer(chat(url(), 'probe', { max_tokens: 4 }));
    expect(probe.status).toBe(200);

    // The engine ran the blocker and the probe, never the jobs taken back.
    const received = (await (await fetch(`${stack.sim.url}/sim/received`)).json()) as {
      requests: { userHead: string | null }[];
    };
    expect(received.requests.map((r) => r.userHead)).toEqual(['blocker', 'probe']);
  });
});
