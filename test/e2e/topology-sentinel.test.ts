// Sluice on Redis Sentinel (REDIS_SENTINELS + REDIS_SENTINEL_MASTER): two gateway replicas, a
// leading and a standby dispatcher, cap 2. The master is SIGKILLed between two bursts; Sentinel
// promotes the replica and every Sluice process follows it with no restart. Every answer is
// intact, the engine never runs more than 2, and no request reaches it twice. The time from
// the kill to service is logged for the operator's figures, not asserted.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  alive,
  answer,
  chat,
  eventually,
  startDispatcher,
  startEngineSim,
  startGateway,
  startSentinel,
  type Answer,
  type SluiceProcess,
  type TestEngineSim,
  type TestSentinel,
} from '../support/index.ts';

const CAP = 2;
let sentinel: TestSentinel;
let sim: TestEngineSim;
let dispatchers: SluiceProcess[] = [];
let gateways: SluiceProcess[] = [];

beforeAll(async () => {
  sentinel = await startSentinel();
  // Each answer takes some steps, far longer than a release: the two slots really fill.
  sim = await startEngineSim([
    '--profile',
    'instant',
    '--model',
    'm',
    '--max-num-seqs',
    '64',
    '--step-overhead-seconds',
    '0.005',
  ]);
  const env = {
    ...sentinel.env,
    VLLM_URL: sim.url,
    VLLM_MODEL: 'm',
    ADMISSION_MAX_INFLIGHT: String(CAP),
    VLLM_MAX_QUEUE_DEPTH: '1000',
    SLUICE_DEGRADATION: 'off',
    NODE_OPTIONS: '--unhandled-rejections=strict',
  };
  const leader = await startDispatcher({ ...env, SLUICE_DISPATCHER_ID: 'leader' });
  dispatchers = [leader];
  await leader.process.waitForLine(/lease acquired/, 60_000);
  dispatchers.push(await startDispatcher({ ...env, SLUICE_DISPATCHER_ID: 'standby' }));
  gateways = await Promise.all([startGateway(env), startGateway(env)]);
}, 120_000);

afterAll(async () => {
  for (const p of [...gateways, ...dispatchers]) await p.stop();
  await sim?.stop();
  await sentinel?.stop();
});

interface Sent {
  content: string;
  extra: Record<string, unknown>;
  answer: Answer;
}

/** `n` requests at once over both gateways, half of them streaming. */
function burst(label: string, n: number): Promise<Sent[]> {
  return Promise.all(
    Array.from({ length: n }, async (_, i) => {
      const content = `${label} ${i}`;
      const extra = { max_tokens: 8 + (i % 13), stream: i % 2 === 0 };
      return { content, extra, answer: await answer(chat(gateways[i % 2]!.url, content, extra)) };
    }),
  );
}

describe('Sentinel failover under Sluice', () => {
  it('serves 20, follows the promotion after SIGKILL of the master with no restart, serves 12 more; cap 2 and nothing twice', async () => {
    await fetch(`${sim.url}/sim/peak/reset`, { method: 'POST' });
    const before = await burst('before the failover', 20);
    for (const s of before) expect(s.answer.status).toBe(200);
    expect((await sim.state()).peakRequests).toBe(CAP); // reached, so the cap was exercised

    const pids = [...dispatchers, ...gateways].map((p) => p.process.child.pid);
    const oldMaster = sentinel.master.port;
    const killedAt = Date.now();
    await sentinel.master.stop('SIGKILL');
    const promoted = await sentinel.waitForFailover(oldMaster);
    const promotedMs = Date.now() - killedAt;
    expect(promoted).toBe(sentinel.replica.port);

    // Each gateway serves again by itself. Refusals while Sluice reconnects are expected
    // (503 with a reason); a request that hangs or an answer that is neither is not.
    let probe = 0;
    const servedMs: number[] = [];
    // What each refused probe was told, for the failure message should none be served.
    const refusals = new Map<string, number>();
    for (const gateway of gateways) {
      await eventually(
        async () => {
          const a = await answer(chat(gateway.url, `probe ${(probe += 1)}`, { max_tokens: 2 }));
          if (a.status !== 200) {
            expect(a.status).toBe(503);
            expect(a.reason).toMatch(/^[a-z_]+$/);
            refusals.set(a.reason!, (refusals.get(a.reason!) ?? 0) + 1);
            return undefined;
          }
          return true;
        },
        'a request served after the failover',
        60_000,
      ).catch((err: unknown) => {
        const told = [...refusals].map(([reason, n]) => `${reason} x${n}`).join(', ');
        const logs = [...dispatchers, ...gateways]
          .map((p) => p.process.output.slice(-20).join('\n'))
          .join('\n---\n');
        throw new Error(`${String(err)}; the probes were told: ${told}\n${logs}`);
      });
      servedMs.push(Date.now() - killedAt);
    }

    const after = await burst('after the failover', 12);
    for (const s of after) expect(s.answer.status).toBe(200);

    // No process was restarted, and none died.
    for (const p of [...dispatchers, ...gateways]) expect(alive(p)).toBe(true);
    expect([...dispatchers, ...gateways].map((p) => p.process.child.pid)).toEqual(pids);

    // The cap held throughout; no request reached the engine twice.
    expect((await sim.state()).peakRequests).toBeLessThanOrEqual(CAP);
    const received = (await (await fetch(`${sim.url}/sim/received`)).json()) as { ids: string[] };
    expect(new Set(received.ids).size).toBe(received.ids.length);
    expect(received.ids.length).toBeGreaterThanOrEqual(20 + 12 + gateways.length);

    // Intact: byte for byte what the engine answers directly (it is deterministic). Asked
    // last, so these direct requests do not count in the check above.
    for (const s of [...before, ...after]) {
      const direct = await answer(chat(sim.url, s.content, s.extra));
      expect(s.answer.body).toBe(direct.body);
    }

    console.info(
      `sentinel failover: replica promoted ${promotedMs} ms after the master's SIGKILL; ` +
        `gateways served again ${servedMs.join(' and ')} ms after it (${probe} probes)`,
    );
  }, 180_000);
});
