// A planned hand-over (SIGTERM to the leading dispatcher) under continuous requests refuses
// nobody. The leader deletes its lease key and the standby takes it within its 250 ms poll; a
// gateway whose leader check falls in that gap used to cache "no leader" for a second and
// answer 503 no_leader to everyone meanwhile, though the queue outlives the leader and the
// next one takes what was queued. Whether a check falls in the gap is left to chance by the
// poll, so the test holds the standby (SIGSTOP) until both gateways have read the missing key
// (Redis MONITOR shows their reads after the deletion), then lets it lead; the requests queued
// meanwhile are answered by it, and those sent right after must not be refused.
import { keySpace } from '@sluice/protocol';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  answer,
  chat,
  eventually,
  monitorRedis,
  startDispatcher,
  startStack,
  untilReady,
  type Answer,
  type SluiceProcess,
  type Stack,
} from '../support/index.ts';

const BEFORE = 20;
const AFTER = 20;
const LEASE = keySpace().lease('default');

let stack: Stack;
let standby: SluiceProcess;

beforeAll(async () => {
  stack = await startStack({ dispatchers: 1, gateways: 2, sim: ['--max-num-seqs', '64'] });
  // Both gateways see the first dispatcher lead before the standby starts.
  await Promise.all(stack.gateways.map((g) => untilReady(g)));
  standby = await startDispatcher({ ...stack.env, SLUICE_DISPATCHER_ID: 'standby' });
});

afterAll(async () => {
  standby?.process.child.kill('SIGCONT');
  await standby?.stop();
  await stack?.stop();
});

type Phase = 'before' | 'handover' | 'resumed' | 'after';

describe('leader hand-over under load', () => {
  it('SIGTERM to the leader: no request is refused no_leader, every one is answered once', async () => {
    const client = new Redis(stack.redis.url);
    const monitor = await monitorRedis(stack.redis.url);
    const leader = stack.dispatcher;
    expect(await client.get(LEASE)).not.toBe('standby');

    // The gateways' reads of the lease key (only gateways EXISTS it), by connection, once the
    // leader has deleted it.
    let deleted = false;
    const lookers = new Set<string>();
    monitor.on('monitor', (_time: string, args: string[], source: string) => {
      if (args[1] !== LEASE) return;
      const command = String(args[0]).toLowerCase();
      if (command === 'del') deleted = true;
      else if (command === 'exists' && deleted) lookers.add(source);
    });

    let phase: Phase = 'before';
    let warmedUp!: () => void;
    const warm = new Promise<void>((resolve) => (warmedUp = resolve));
    let loopsWarm = 0;
    const answers: Array<Answer & { mark: string; phase: Phase; answeredIn: Phase }> = [];
    // Each gateway gets one request after the other, each awaited: BEFORE of them, those sent
    // while the lease changes hands, and AFTER more once the standby leads.
    const loop = async (g: number) => {
      let after = 0;
      for (let i = 0; after < AFTER; i += 1) {
        const sentIn = phase;
        const mark = `g${g}-r${i}`;
        const a = await answer(chat(stack.gateways[g]!.url, mark, { max_tokens: 4 }));
        answers.push({ ...a, mark, phase: sentIn, answeredIn: phase });
        if (i + 1 === BEFORE && (loopsWarm += 1) === stack.gateways.length) warmedUp();
        if (sentIn === 'after') after += 1;
      }
    };
    const handOver = async () => {
      await warm;
      standby.process.child.kill('SIGSTOP');
      phase = 'handover';
      const leaderGone = leader.stop('SIGTERM');
      // The requests sent meanwhile are queued and wait for the standby, so /readyz, which asks
      // what a request would, has each gateway read the lease once its cached answer ends.
      await eventually(async () => {
        await Promise.all(
          stack.gateways.map((g) => fetch(`${g.url}/readyz`).then((r) => r.text())),
        );
        return lookers.size === stack.gateways.length ? true : undefined;
      }, 'both gateways to read the missing lease');
      standby.process.child.kill('SIGCONT');
      phase = 'resumed';
      await eventually(
        async () => ((await client.get(LEASE)) === 'standby' ? true : undefined),
        'the standby to lead',
      );
      await leaderGone;
      phase = 'after';
    };
    await Promise.all([handOver(), ...stack.gateways.map((_, g) => loop(g))]);
    await Promise.all([client.quit(), monitor.disconnect()]);

    const refused = answers.filter((a) => a.status !== 200);
    expect(
      refused.map((a) => `${a.mark} (${a.phase}): ${a.status} ${a.reason}`),
      'refused or failed requests',
    ).toEqual([]);
    for (const a of answers)
      expect(JSON.parse(a.body).choices[0].finish_reason, a.mark).toBe('length');
    // Requests waited in the queue while nobody led, and the standby answered them.
    const waited = answers.filter(
      (a) =>
        (a.phase === 'before' || a.phase === 'handover') &&
        (a.answeredIn === 'resumed' || a.answeredIn === 'after'),
    );
    expect(waited.length).toBeGreaterThan(0);
    expect(answers.filter((a) => a.phase === 'after')).toHaveLength(AFTER * 2);
    // Each reached the engine once.
    expect((await stack.sim.state()).receivedTotal).toBe(answers.length);
  });
});
