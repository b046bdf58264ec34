// `sluice pool pause|resume|drain` against a real stack, run as the operator runs it: pause
// stops releases (requests queue, the engine receives nothing new) and resume restarts them;
// drain refuses new requests with 503 pool_draining and finishes the queued ones. Every wait
// is for an event: the CLI's answer, a snapshot the leader published, an HTTP answer.
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { decodePoolStats, keySpace, type PoolStats } from '@sluice/protocol';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  answer,
  chat,
  eventually,
  sluiceBin,
  startDispatcher,
  startStack,
  type Answer,
  type Stack,
} from '../support/index.ts';

const keys = keySpace('sluice');
let stack: Stack;
let client: Redis;

beforeAll(async () => {
  stack = await startStack({ env: { ADMISSION_MAX_INFLIGHT: '2', VLLM_MAX_QUEUE_DEPTH: '8' } });
  client = new Redis(stack.redis.url);
  await published((s) => s.engines.every((e) => e.health === 'healthy'), 'a healthy leader');
});

afterAll(async () => {
  await client?.quit();
  await stack?.stop();
});

async function sluice(
  args: string[],
  env: Record<string, string> = {},
): Promise<{ code: number; stdout: string; stderr: string }> {
  try {
    const { stdout, stderr } = await promisify(execFile)(process.execPath, [sluiceBin, ...args], {
      env: { ...process.env, ...stack.env, ...env },
    });
    return { code: 0, stdout, stderr };
  } catch (err) {
    const e = err as { code: number; stdout: string; stderr: string };
    return { code: e.code, stdout: e.stdout, stderr: e.stderr };
  }
}

/** The first snapshot the leader publishes that satisfies `check`. */
function published(check: (s: PoolStats) => boolean, what: string): Promise<PoolStats> {
  return eventually(async () => {
    const text = await client.get(keys.poolStats('default'));
    const stats = text ? decodePoolStats(text) : undefined;
    return stats && check(stats) ? stats : undefined;
  }, what);
}

const queuedIn = (s: PoolStats) =>
  s.queue ? s.queue.wait + s.queue.prioritized + (s.queue.delayed ?? 0) : 0;

async function received(): Promise<number> {
  return (await stack.sim.state())['receivedTotal'] as number;
}

async function dispatcherMetric(series: string): Promise<number | undefined> {
  const text = await (await fetch(`${stack.dispatcher.url}/metrics`)).text();
  const line = text.split('\n').find((l) => l.startsWith(`${series} `));
  return line === undefined ? undefined : Number(line.split(' ').pop());
}

describe('sluice pool', () => {
  it('refuses an unknown pool, action or flag with exit 2 and one line', async () => {
    const unknownPool = await sluice(['pool', 'pause', 'nope']);
    expect(unknownPool.code).toBe(2);
    expect(unknownPool.stderr.trim().split('\n')).toEqual([
      'sluice pool: unknown pool "nope": expected one of default',
    ]);
    const unknownAction = await sluice(['pool', 'halt', 'default']);
    expect(unknownAction.code).toBe(2);
    expect(unknownAction.stderr).toMatch(/unknown action "halt"/);
    const unknownFlag = await sluice(['pool', 'pause', 'default', '--now']);
    expect(unknownFlag.code).toBe(2);
    expect(unknownFlag.stderr).toMatch(/Unknown option '--now'/);
    expect(await client.exists(keys.poolControl('default'))).toBe(0);
  });

  it('says so, exit 1, when no leader shows the mode in time; the mode is set all the same', async () => {
    // Another prefix: the pool is configured, but no dispatcher leads it there.
    const { code, stderr } = await sluice(['pool', 'drain', 'default', '--timeout', '0.5'], {
      SLUICE_REDIS_PREFIX: 'elsewhere',
    });
    expect(code).toBe(1);
    expect(stderr.trim().split('\n')).toEqual([
      'sluice pool: pool default is set to draining in Redis, but no dispatcher leads it after 0.5 s; the mode applies when a leader reads it (gateways refuse new requests already)',
    ]);
    expect(await client.get(keySpace('elsewhere').poolControl('default'))).toBe('draining');
  });

  it('pause stops releases while requests queue; resume releases them', async () => {
    expect((await answer(chat(stack.gateway.url, 'warm up', { max_tokens: 2 }))).status).toBe(200);
    const before = await received();

    const paused = await sluice(['pool', 'pause', 'default']);
    expect(paused).toMatchObject({ code: 0, stderr: '' });
    expect(paused.stdout).toMatch(/^pool default paused: .*\(leader dispatcher-\w+, 0 queued\)\n$/);
    expect(await client.get(keys.poolControl('default'))).toBe('paused');

    const waiting: Array<Promise<Answer>> = [1, 2, 3].map((i) =>
      answer(chat(stack.gateway.url, `queued ${i}`, { max_tokens: 2 })),
    );
    // A snapshot shows the three waiting, and a later one (a whole stats tick after) still
    // does: the leader released none of them meanwhile.
    const first = await published(
      (s) => s.mode === 'paused' && queuedIn(s) === 3,
      'three requests queued while paused',
    );
    const later = await published((s) => s.at > first.at, 'the next snapshot');
    expect(later).toMatchObject({ mode: 'paused' });
    expect(queuedIn(later)).toBe(3);
    expect(later.oldestQueuedMs).toBeGreaterThan(0);
    expect(later.engines.map((e) => e.inflight)).toEqual([0]);
    expect(await received()).toBe(before);
    expect(await dispatcherMetric('sluice_pool_mode{pool="default",mode="paused"}')).toBe(1);
    expect(await dispatcherMetric('sluice_pool_mode{pool="default",mode="open"}')).toBe(0);
    expect(await dispatcherMetric('sluice_gate_open{pool="default"}')).toBe(0);
    expect(
      await dispatcherMetric('sluice_queue_oldest_age_seconds{pool="default"}'),
    ).toBeGreaterThan(0);
    const status = await sluice(['status']);
    expect(status.stdout).toMatch(/pool default {2}mode paused .* oldest \d+\.\d s/);

    const resumed = await sluice(['pool', 'resume', 'default']);
    expect(resumed.code).toBe(0);
    expect(resumed.stdout).toMatch(/^pool default open: /);
    expect(await client.exists(keys.poolControl('default'))).toBe(0);
    expect((await Promise.all(waiting)).map((a) => a.status)).toEqual([200, 200, 200]);
    expect(await received()).toBe(before + 3);
    // The restarted release loop says its gate is open again.
    await eventually(
      async () => (await dispatcherMetric('sluice_gate_open{pool="default"}')) === 1,
      'sluice_gate_open back at 1',
    );
    const open = await published((s) => queuedIn(s) === 0, 'an empty queue');
    expect(open).toMatchObject({ mode: 'open', oldestQueuedMs: 0 });
  });

  it('drain refuses new requests with 503 pool_draining and finishes the queued ones', async () => {
    // Paused first, so that requests are queued when the drain begins.
    expect((await sluice(['pool', 'pause', 'default'])).code).toBe(0);
    const queued: Array<Promise<Answer>> = [1, 2].map((i) =>
      answer(chat(stack.gateway.url, `before the drain ${i}`, { max_tokens: 2 })),
    );
    await published((s) => queuedIn(s) === 2, 'two requests queued');

    const draining = await sluice(['pool', 'drain', 'default']);
    expect(draining.code).toBe(0);
    expect(draining.stdout).toMatch(/^pool default draining: gateways refuse new requests/);
    const refused = await answer(chat(stack.gateway.url, 'during the drain', { max_tokens: 2 }));
    expect(refused.status).toBe(503);
    expect(refused.reason).toBe('pool_draining');
    expect(refused.retryAfter).toBe('30');
    expect(JSON.parse(refused.body)).toMatchObject({
      error: { code: 'pool_draining', message: expect.stringMatching(/pool default is draining/) },
    });
    const gatewayMetrics = await (await fetch(`${stack.gateway.url}/metrics`)).text();
    expect(gatewayMetrics).toMatch(
      /^sluice_rejected_total\{model="m",reason="pool_draining"\} 1$/m,
    );
    // The queued ones are finished all the same.
    expect((await Promise.all(queued)).map((a) => a.status)).toEqual([200, 200]);
    const drained = await published(
      (s) => s.mode === 'draining' && queuedIn(s) === 0,
      'the drained queue',
    );
    expect(drained.oldestQueuedMs).toBe(0);
    expect(await dispatcherMetric('sluice_pool_mode{pool="default",mode="draining"}')).toBe(1);

    expect((await sluice(['pool', 'resume', 'default'])).code).toBe(0);
    expect((await answer(chat(stack.gateway.url, 'after', { max_tokens: 2 }))).status).toBe(200);
  });

  it('a new leader keeps the pool paused', async () => {
    expect((await sluice(['pool', 'pause', 'default'])).code).toBe(0);
    const old = await published((s) => s.mode === 'paused', 'the paused pool');
    const standby = await startDispatcher(stack.env);
    try {
      // Stopping hands the lease over: the standby leads, reading the mode before it releases.
      await stack.dispatcher.stop();
      // A request sent while no dispatcher leads would be refused (no_leader): it goes once
      // the new leader has published.
      const taken = await published((s) => s.leader !== old.leader, 'the new leader');
      expect(taken.mode).toBe('paused');
      const before = await received();
      const waiting = answer(chat(stack.gateway.url, 'across the failover', { max_tokens: 2 }));
      const first = await published(
        (s) => s.leader === taken.leader && queuedIn(s) === 1,
        'the new leader with the request queued',
      );
      const later = await published(
        (s) => s.at > first.at && s.leader === first.leader,
        "the new leader's next snapshot",
      );
      expect(later.mode).toBe('paused');
      expect(queuedIn(later)).toBe(1);
      expect(await received()).toBe(before);
      expect((await sluice(['pool', 'resume', 'default'])).code).toBe(0);
      expect((await waiting).status).toBe(200);
    } finally {
      await standby.stop();
    }
  });

  it('a drained pool whose last dispatcher stopped says it is draining, not that nobody leads', async () => {
    // The test before stopped the last dispatcher: nobody leads now.
    await eventually(async () => {
      const ready = (await (await fetch(`${stack.gateway.url}/readyz`)).json()) as {
        leaders: Record<string, boolean>;
      };
      return ready.leaders['default'] === false ? true : undefined;
    }, 'the gateway to see no leader');
    // The CLI sets the mode, and says that no leader showed it (exit 1).
    expect((await sluice(['pool', 'drain', 'default', '--timeout', '0.5'])).code).toBe(1);
    const refused = await answer(chat(stack.gateway.url, 'drained, leaderless', { max_tokens: 2 }));
    expect([refused.status, refused.reason, refused.retryAfter]).toEqual([
      503,
      'pool_draining',
      '30',
    ]);
    expect((await sluice(['pool', 'resume', 'default', '--timeout', '0.5'])).code).toBe(1);
    const noLeader = await answer(
      chat(stack.gateway.url, 'resumed, leaderless', { max_tokens: 2 }),
    );
    expect([noLeader.status, noLeader.reason]).toEqual([503, 'no_leader']);
  });
});
