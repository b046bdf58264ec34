// Two keyed tenants share one engine of cap 2. Redis stops answering (SIGSTOP) while both
// have requests queued and running, then goes on (SIGCONT): once briefly, and once for so
// long that the leader loses its lease. The leader's fair share sends its move and its next
// reading ahead of each take on BullMQ's connection, so a stop leaves those in flight: every
// client must still get an answer (served, or refused with a reason), the engine must not
// exceed the cap nor keep anything running, and afterwards both tenants are served again
// with the picks reading ahead as before.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  answer,
  eventually,
  metricSum,
  startStack,
  tenantPoolYaml,
  untilReady,
  type Answer,
  type SluiceProcess,
  type Stack,
  type TestEngineSim,
  type TestRedis,
} from '../support/index.ts';

const KEYS = {
  alpha: 'sk-alpha-redis-stop-test-0123456',
  beta: 'sk-beta-redis-stop-test-01234567',
};
const PER_TENANT = 12;

let stack: Stack;
let redis: TestRedis;
let sim: TestEngineSim;
let dispatcher: SluiceProcess;
let gateway: SluiceProcess;

beforeAll(async () => {
  stack = await startStack({
    // Each answer takes a few decode steps, so a backlog forms behind the cap.
    sim: ['--max-num-seqs', '64', '--decode-seconds-per-sequence', '0.005'],
    config: ({ url }) =>
      tenantPoolYaml({ tenants: KEYS, engineUrl: url, maxInflight: 2, queueDepth: 100 }),
  });
  ({ redis, sim, dispatcher, gateway } = stack);
  await untilReady(gateway);
}, 60_000);

afterAll(async () => {
  redis?.process.child.kill('SIGCONT');
  await stack?.stop();
});

function send(key: string, content: string): Promise<Answer> {
  return answer(
    fetch(`${gateway.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${key}` },
      body: JSON.stringify({
        model: 'm',
        messages: [{ role: 'user', content }],
        max_tokens: 8,
      }),
    }),
  );
}

/** Both tenants at once, `n` requests each. */
function burst(n: number, tag: string): Promise<Answer[]> {
  return Promise.all(
    Object.values(KEYS).flatMap((key) =>
      Array.from({ length: n }, (_, i) => send(key, `${tag} ${i}`)),
    ),
  );
}

/** `sluice_fair_share_readings_total{source="ahead"}` on the leader. */
async function readingsAhead(): Promise<number> {
  return (
    (await metricSum(dispatcher.url, 'sluice_fair_share_readings_total', { source: 'ahead' })) ?? 0
  );
}

/** Every answer is served, or refused with a reason and a time to come back. */
function expectAnswered(answers: Answer[]) {
  for (const a of answers) {
    if (a.status === 200) expect(a.body).toContain('"choices"');
    else {
      expect(a.status, a.body).toBe(503);
      expect(a.reason, a.body).toMatch(/^(redis_unavailable|queue_lost|dispatcher_lost)$/);
      expect(Number(a.retryAfter)).toBeGreaterThanOrEqual(1);
    }
  }
}

/**
 * Stops Redis while both tenants have requests running and queued, until `resumeWhen` says
 * so, then lets it go on; answers what the clients got.
 */
async function stopDuringBurst(tag: string, resumeWhen: () => Promise<true | undefined>) {
  const during = burst(PER_TENANT, tag);
  // Stop once the engine runs the first of them: the rest are queued behind the cap.
  await eventually(
    async () => ((await sim.state()).running > 0 ? true : undefined),
    'the engine to run the first requests',
  );
  redis.process.child.kill('SIGSTOP');
  try {
    await eventually(resumeWhen, 'the fault to be seen');
  } finally {
    redis.process.child.kill('SIGCONT');
  }
  return during;
}

/** Both tenants served again, the picks reading ahead, the cap held, nothing left running. */
async function servedAfter(tag: string) {
  await untilReady(gateway);
  const aheadBefore = await readingsAhead();
  const after = await burst(PER_TENANT, tag);
  expect(after.map((a) => a.status)).toEqual(after.map(() => 200));
  expect(await readingsAhead()).toBeGreaterThan(aheadBefore);
  // The cap held throughout (running + waiting on the engine, as vLLM counts them).
  expect((await sim.state()).peakRequests).toBeLessThanOrEqual(2);
  await eventually(
    async () => ((await sim.state()).running === 0 ? true : undefined),
    'the engine to run nothing once every client was answered',
  );
}

describe('tenant pool, Redis stopped and continued', () => {
  it('serves both tenants before the fault', async () => {
    expect((await burst(2, 'before')).map((a) => a.status)).toEqual([200, 200, 200, 200]);
  });

  it('a short stop: every client answered, then both tenants served as before', async () => {
    const answers = await stopDuringBurst('short', async () => {
      const ready = (await (await fetch(`${gateway.url}/readyz`)).json()) as { redis: boolean };
      return ready.redis === false ? true : undefined;
    });
    expectAnswered(answers);
    await servedAfter('after short');
  });

  it('a stop past the lease: every client answered, then both tenants served as before', async () => {
    const lost = () => dispatcher.process.output.filter((l) => l.includes('lease lost')).length;
    const before = lost();
    const answers = await stopDuringBurst('long', async () => (lost() > before ? true : undefined));
    expectAnswered(answers);
    await servedAfter('after long');
  });
});
