// The dispatcher through faults, on real processes: its leader stopped for a rolling update,
// a gateway replica killed with streams in flight, Redis killed and restarted, and start-up
// without Redis or with a wrong password.
import { spawn } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { keySpace } from '@sluice/protocol';
import { Redis } from 'ioredis';
import { afterEach, describe, expect, it } from 'vitest';
import {
  alive,
  answer,
  chat,
  eventually,
  freePort,
  metricSum,
  queuedJobs,
  sluiceBin,
  startDispatcher,
  startEngineSim,
  startGateway,
  startProcess,
  startRedis,
  type TestRedis,
} from '../support/index.ts';

const cleanup: Array<{ stop(): Promise<void> }> = [];
afterEach(async () => {
  for (const p of cleanup.splice(0).reverse()) await p.stop().catch(() => {});
});
const track = <T extends { stop(): Promise<void> }>(p: T): T => {
  cleanup.push(p);
  return p;
};

/** The simulator emits a token every 10 ms per sequence: streams long enough to be caught. */
const slowSim = () =>
  startEngineSim([
    '--profile',
    'instant',
    '--model',
    'm',
    '--max-num-seqs',
    '64',
    '--decode-seconds-per-sequence',
    '0.01',
  ]);

describe('dispatcher faults', () => {
  it('leader SIGTERM with 2 in flight and 6 queued: the standby leads, 8/8 complete intact, the engine sees each once', async () => {
    const redis = track(await startRedis());
    const sim = track(await slowSim());
    const env = {
      REDIS_URL: redis.url,
      VLLM_URL: sim.url,
      VLLM_MODEL: 'm',
      ADMISSION_MAX_INFLIGHT: '2',
      SLUICE_LEASE_TTL_MS: '3000',
    };
    const leader = track(await startDispatcher({ ...env, SLUICE_DISPATCHER_ID: 'leader' }));
    await leader.process.waitForLine(/lease acquired/);
    const standby = track(await startDispatcher({ ...env, SLUICE_DISPATCHER_ID: 'standby' }));
    const gateway = track(await startGateway(env));
    const client = new Redis(redis.url);
    try {
      const answers = Array.from({ length: 8 }, (_, i) =>
        answer(chat(gateway.url, `req ${i}`, { stream: true, max_tokens: 150, ignore_eos: true })),
      );
      await eventually(
        async () => (await queuedJobs(client)) === 6 && (await sim.state()).running === 2,
        '2 in flight and 6 queued',
      );
      const sigtermAt = Date.now();
      await leader.stop('SIGTERM');
      expect(leader.process.child.exitCode).toBe(0);
      // A handover on purpose, logged as one: a rolling update raises no warning.
      expect(leader.process.output.filter((l) => l.includes('lease handed over'))).toHaveLength(1);
      expect(leader.process.output.filter((l) => l.includes('lease lost'))).toEqual([]);
      const acquired = await standby.process.waitForLine(/"time":(\d+),.*"msg":"lease acquired/);
      // For the operator's figures (both clocks are this machine's); speed is not asserted.
      console.info(
        `leader SIGTERM: the standby led ${Number(acquired[1]) - sigtermAt} ms after it`,
      );
      for (const a of await Promise.all(answers)) {
        expect(a.status).toBe(200);
        expect(a.body).not.toContain('"error"');
        expect(a.body).toMatch(/data: \[DONE\]\n\n$/);
      }
      const received = (await (await fetch(`${sim.url}/sim/received`)).json()) as {
        ids: string[];
      };
      expect(received.ids).toHaveLength(8);
      expect(new Set(received.ids).size).toBe(8);
      expect(await client.get(keySpace().lease('default'))).toBe('standby');
    } finally {
      await client.quit();
    }
  });

  it('gateway SIGKILL: its engine requests are cancelled, the other gateway is served', async () => {
    const redis = track(await startRedis());
    const sim = track(await slowSim());
    const env = {
      REDIS_URL: redis.url,
      VLLM_URL: sim.url,
      VLLM_MODEL: 'm',
      ADMISSION_MAX_INFLIGHT: '8',
      SLUICE_REPLICA_TTL_MS: '1000',
    };
    track(await startDispatcher(env));
    const [a, b] = await Promise.all([
      startGateway({ ...env, SLUICE_REPLICA_ID: 'gw-a' }),
      startGateway({ ...env, SLUICE_REPLICA_ID: 'gw-b' }),
    ]);
    track(a);
    track(b);
    const streams = await Promise.all(
      [0, 1, 2, 3].map((i) =>
        chat(a.url, `doomed ${i}`, { stream: true, max_tokens: 100_000, ignore_eos: true }),
      ),
    );
    await Promise.all(streams.map((r) => r.body!.getReader().read()));
    expect((await sim.state()).running).toBe(4);
    await a.stop('SIGKILL');
    await eventually(async () => (await sim.state()).running === 0, 'the engine to run nothing');
    const served = await answer(chat(b.url, 'after', { max_tokens: 4 }));
    expect(served.status).toBe(200);
  });

  it('Redis SIGKILL with jobs in flight and queued: nothing crashes, engine requests are cancelled, service resumes, no slot leaks', async () => {
    // Persisted: the queued jobs survive the restart and are served.
    const dir = await mkdtemp(join(tmpdir(), 'sluice-faults-'));
    // Tracked first, so removed last: once both Redis servers writing into it have stopped.
    cleanup.push({ stop: () => rm(dir, { recursive: true, force: true }) });
    const redis = await startRedis({ appendonly: dir });
    const port = redis.port;
    let current: TestRedis = redis;
    cleanup.push({ stop: () => current.stop() });
    const sim = track(await slowSim());
    const env = {
      REDIS_URL: redis.url,
      VLLM_URL: sim.url,
      VLLM_MODEL: 'm',
      ADMISSION_MAX_INFLIGHT: '2',
      SLUICE_REDIS_LOSS_GRACE_SECONDS: '1',
      SLUICE_LEASE_TTL_MS: '2000',
      NODE_OPTIONS: '--unhandled-rejections=strict',
    };
    const dispatcher = track(await startDispatcher(env));
    const gateway = track(await startGateway(env));
    const client = new Redis(redis.url);
    client.on('error', () => {});
    const long = [0, 1].map((i) =>
      answer(
        chat(gateway.url, `long ${i}`, { stream: true, max_tokens: 100_000, ignore_eos: true }),
      ),
    );
    await eventually(async () => (await sim.state()).running === 2, '2 in flight');
    const queued = [0, 1].map((i) => answer(chat(gateway.url, `queued ${i}`, { max_tokens: 4 })));
    await eventually(async () => (await queuedJobs(client)) === 2, '2 queued');
    client.disconnect();
    await redis.process.stop('SIGKILL');
    // Past the loss grace the engine requests nobody can receive are cancelled.
    await eventually(async () => (await sim.state()).running === 0, 'the engine to run nothing');
    await dispatcher.process.waitForLine(/Redis unreachable past the loss grace/);
    current = await startRedis({ port, appendonly: dir });
    expect(alive(dispatcher)).toBe(true);
    expect(alive(gateway)).toBe(true);
    // Served again, by itself.
    const after = await eventually(async () => {
      const a = await answer(chat(gateway.url, 'after', { max_tokens: 4 }));
      return a.status === 200 ? a : undefined;
    }, 'a request to be served after the outage');
    expect(after.body).toContain('"choices"');
    // At idle: no slot held anywhere.
    await eventually(
      async () => (await metricSum(dispatcher.url, 'sluice_inflight')) === 0,
      'the dispatcher to count nothing in flight',
    );
    expect((await sim.state()).running).toBe(0);
    expect(alive(dispatcher)).toBe(true);
    expect(alive(gateway)).toBe(true);
    // Every client got an answer of some kind; none is left hanging.
    await Promise.all([...long, ...queued]);
  });

  it('starts without Redis: /healthz 200 and /readyz 503 at once, ready once Redis appears', async () => {
    const sim = track(await startEngineSim(['--profile', 'instant', '--model', 'm']));
    const port = await freePort();
    const proc = track(
      await startProcess({
        command: process.execPath,
        args: [sluiceBin, 'dispatcher'],
        env: {
          LOG_LEVEL: 'info',
          HOST: '127.0.0.1',
          METRICS_PORT: '0',
          REDIS_URL: `redis://127.0.0.1:${port}`,
          VLLM_URL: sim.url,
          VLLM_MODEL: 'm',
        },
        ready: /"url":"([^"]+)".*"msg":"dispatcher listening/,
      }),
    );
    const url = proc.ready[1]!;
    expect((await fetch(`${url}/healthz`)).status).toBe(200);
    expect((await fetch(`${url}/readyz`)).status).toBe(503);
    track(await startRedis({ port }));
    await proc.waitForLine(/"msg":"dispatcher ready"/);
    await eventually(async () => (await fetch(`${url}/readyz`)).status === 200, 'ready');
  });

  it('a wrong Redis password is fatal: one line on stderr, exit code 1', async () => {
    const redis = track(await startRedis({ password: 'right' }));
    const child = spawn(process.execPath, [sluiceBin, 'dispatcher'], {
      env: {
        ...process.env,
        LOG_LEVEL: 'info',
        METRICS_PORT: '0',
        HOST: '127.0.0.1',
        REDIS_URL: `redis://:wrong@127.0.0.1:${redis.port}`,
        VLLM_URL: 'http://127.0.0.1:9',
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stderr = '';
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    const code = await new Promise<number | null>((resolve) => child.once('exit', resolve));
    expect(code).toBe(1);
    const lines = stderr.trim().split('\n');
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatch(/^sluice dispatcher: .*refused the credentials/);
  });
});
