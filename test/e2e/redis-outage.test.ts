// The whole Redis outage in one run, as an operator sees it: Redis is SIGKILLed with four
// streams on the engine and two clients queued behind them, stays away, and comes back empty
// on the same port. Every held client is answered (the streams in-band, the queued ones with
// 503), newcomers get 503 redis_unavailable while it is away, the engine stops running for
// nobody, service resumes by itself, the cap holds throughout, and no slot stays taken.
//
// Every Sluice process runs with --unhandled-rejections=strict, so a rejection nobody handles
// during the outage ends it, and the test sees it. Durations go to the log for the operator's
// figures; the test asserts outcomes, not speed.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  alive,
  answer,
  chat,
  streamStarted,
  eventually,
  metricSum,
  type SluiceProcess,
  startDispatcher,
  startEngineSim,
  startGateway,
  startRedis,
  type TestEngineSim,
  type TestRedis,
} from '../support/index.ts';

const CAP = 4;
let redis: TestRedis;
let sim: TestEngineSim;
let dispatchers: SluiceProcess[];
let gateways: SluiceProcess[];

beforeAll(async () => {
  redis = await startRedis();
  // 20 ms a token: a stream of 100,000 tokens outlasts the test by far.
  sim = await startEngineSim([
    '--profile',
    'instant',
    '--model',
    'm',
    '--max-num-seqs',
    '64',
    '--decode-seconds-per-sequence',
    '0.02',
  ]);
  const env = {
    REDIS_URL: redis.url,
    VLLM_URL: sim.url,
    VLLM_MODEL: 'm',
    ADMISSION_MAX_INFLIGHT: String(CAP),
    SLUICE_DEGRADATION: 'off',
    NODE_OPTIONS: '--unhandled-rejections=strict',
  };
  // A leader and a standby, and two gateway replicas: the outage reaches every kind of process.
  dispatchers = [await startDispatcher(env), await startDispatcher(env)];
  gateways = await Promise.all([startGateway(env), startGateway(env)]);
});

afterAll(async () => {
  for (const p of [...(gateways ?? []), ...(dispatchers ?? [])]) await p.stop();
  await sim?.stop();
  await redis?.stop();
});

/** Opens a stream and resolves once its first event arrived, with the rest of it to come. */
async function openStream(base: string, content: string) {
  const res = await chat(base, content, { stream: true, max_tokens: 100_000, ignore_eos: true });
  expect(res.status).toBe(200);
  return streamStarted(res);
}

describe('a Redis outage, end to end', () => {
  it('answers every held client, refuses newcomers with 503, cancels the engine work, and resumes with no slot leaked', async () => {
    await fetch(`${sim.url}/sim/peak/reset`, { method: 'POST' });
    const streams = await Promise.all(
      [0, 1, 2, 3].map((i) => openStream(gateways[i % 2]!.url, `stream ${i}`)),
    );
    await eventually(async () => (await sim.state()).running === CAP, 'four streams on the engine');
    const queued = [0, 1].map((i) =>
      answer(chat(gateways[i % 2]!.url, `queued ${i}`, { max_tokens: 4 })),
    );
    await eventually(
      async () =>
        (await Promise.all(gateways.map((g) => metricSum(g.url, 'sluice_parked_requests')))).reduce(
          (a: number, b) => a + (b ?? 0),
          0,
        ) === 2,
      'two clients queued behind the streams',
    );

    const killedAt = Date.now();
    await redis.process.stop('SIGKILL');

    // A newcomer during the outage: refused at once, with a reason and a time to come back.
    const newcomerSentAt = Date.now();
    const newcomer = await answer(chat(gateways[0]!.url, 'newcomer', { max_tokens: 4 }));
    const newcomerMs = Date.now() - newcomerSentAt;
    expect(newcomer.status).toBe(503);
    expect(newcomer.reason).toBe('redis_unavailable');
    expect(Number(newcomer.retryAfter)).toBeGreaterThanOrEqual(1);

    // Every held client is answered: the streams in-band, the queued clients with a 503.
    const ended = await Promise.all(streams.map((s) => s.rest));
    const streamsEndedMs = Date.now() - killedAt;
    for (const text of ended) {
      // The error, then vLLM's closing `data: [DONE]`.
      const events = text.split('\n').filter((l) => l.startsWith('data: '));
      expect(events.at(-1)).toBe('data: [DONE]');
      const last = events.at(-2)!;
      expect(last).toMatch(/^data: \{"error":/);
      expect(JSON.parse(last.slice('data: '.length)).error.code).toBe('redis_unavailable');
    }
    for (const a of await Promise.all(queued)) {
      expect(a.status).toBe(503);
      expect(a.reason).toBe('redis_unavailable');
      expect(Number(a.retryAfter)).toBeGreaterThanOrEqual(1);
    }

    // Nobody can receive what the engine still generates: its requests are cancelled.
    await eventually(
      async () => ((await sim.state()).running === 0 ? true : undefined),
      'the engine to run nothing for nobody',
    );
    const engineFreedMs = Date.now() - killedAt;

    // Redis comes back empty on the same port; Sluice serves again by itself.
    const back = await startRedis({ port: redis.port });
    redis = back;
    const backAt = Date.now();
    for (const gateway of gateways) {
      const served = await eventually(async () => {
        const a = await answer(chat(gateway.url, 'after the outage', { max_tokens: 4 }));
        return a.status === 200 ? a : undefined;
      }, 'a request to be served after the outage');
      expect(served.body).toContain('"choices"');
    }
    const resumedMs = Date.now() - backAt;

    // The cap held, and at idle no slot is taken anywhere.
    expect((await sim.state()).peakRequests).toBeLessThanOrEqual(CAP);
    // A standby that never released exports no in-flight series; the leader that ran the
    // streams does, and both must count nothing now.
    await eventually(async () => {
      const counts = await Promise.all(dispatchers.map((d) => metricSum(d.url, 'sluice_inflight')));
      return counts.some((n) => n !== undefined) && counts.every((n) => (n ?? 0) === 0)
        ? true
        : undefined;
    }, 'no dispatcher to count anything in flight');
    for (const gateway of gateways)
      expect(await metricSum(gateway.url, 'sluice_held_requests')).toBe(0);
    expect((await sim.state()).running).toBe(0);
    for (const p of [...dispatchers, ...gateways]) expect(alive(p)).toBe(true);

    console.info(
      `redis outage: newcomer answered in ${newcomerMs} ms; 4 streams ended ${streamsEndedMs} ms after the kill; ` +
        `engine freed ${engineFreedMs} ms after it; served again ${resumedMs} ms after Redis was back`,
    );
  });
});
