// Redis lost under held clients (SIGKILL), then back on the same port: persisted (its
// append-only file), or empty. Queued clients are served when their jobs survived and told
// `queue_lost` within seconds when they did not; with the reply connection gone past the
// grace period, every held client is answered (503 or in-band) and its engine request is
// cancelled once Redis is back.
//
// The tests share one Redis and run in order: the first restart keeps the data, the later
// ones start empty.
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  chat,
  eventually,
  queuedJobs,
  readAll,
  type SluiceProcess,
  startDispatcher,
  startEngineSim,
  startGateway,
  startRedis,
  type TestEngineSim,
  type TestRedis,
} from '../support/index.ts';

let redis: TestRedis;
let aofDir: string;
let sim: TestEngineSim;
let dispatcher: SluiceProcess;
let env: Record<string, string>;

beforeAll(async () => {
  aofDir = await mkdtemp(join(tmpdir(), 'sluice-faults-'));
  redis = await startRedis({ appendonly: aofDir });
  await fsyncEveryWrite();
  sim = await startEngineSim(['--profile', 'instant', '--model', 'm', '--max-num-seqs', '64']);
  env = {
    REDIS_URL: redis.url,
    VLLM_URL: sim.url,
    VLLM_MODEL: 'm',
    ADMISSION_MAX_INFLIGHT: '1',
    SLUICE_DEGRADATION: 'off',
  };
  dispatcher = await startDispatcher(env);
});

afterAll(async () => {
  await dispatcher?.stop();
  await sim?.stop();
  await redis?.stop();
  // After the last Redis has stopped: each of them wrote its append-only file here.
  if (aofDir) await rm(aofDir, { recursive: true, force: true });
});

/** A SIGKILL loses what the append-only file had not synced yet: sync every write. */
async function fsyncEveryWrite() {
  const admin = new Redis(redis.url);
  await admin.config('SET', 'appendfsync', 'always');
  await admin.quit();
}

/** SIGKILL, then a new server on the same port: from the append-only file, or empty. */
async function restartRedis(persisted: boolean) {
  await redis.process.stop('SIGKILL');
  redis = await startRedis({
    port: redis.port,
    ...(persisted ? { appendonly: aofDir } : {}),
  });
}

/** A request queued while the dispatcher is stopped (SIGSTOP), so it stays queued. */
async function queueWithDispatcherStopped(
  gateway: SluiceProcess,
): Promise<{ answer: Promise<Response> }> {
  await eventually(async () => {
    const res = await chat(gateway.url, 'warm-up', { max_tokens: 2 });
    return res.status === 200 ? true : undefined;
  }, 'a leading dispatcher serving');
  dispatcher.process.child.kill('SIGSTOP');
  const answer = chat(gateway.url, 'queued', { max_tokens: 4 });
  const client = new Redis(redis.url);
  try {
    await eventually(
      async () => ((await queuedJobs(client)) === 1 ? true : undefined),
      'one queued job',
    );
  } finally {
    client.disconnect();
  }
  return { answer };
}

describe('Redis faults under held clients', () => {
  it('Redis back persisted: the queued request is served as if nothing happened', async () => {
    // A long grace: the reply connection's outage is ridden out, not answered.
    const gateway = await startGateway({ ...env, SLUICE_REDIS_LOSS_GRACE_SECONDS: '60' });
    try {
      const { answer } = await queueWithDispatcherStopped(gateway);
      await restartRedis(true);
      const client = new Redis(redis.url);
      try {
        // The append-only file kept the job.
        expect(await queuedJobs(client)).toBe(1);
        // The dispatcher's answer must find the gateway subscribed again, or it is lost.
        await gateway.process.waitForLine(/"msg":"reply connection back"/);
        await eventually(
          async () =>
            ((await client.pubsub('CHANNELS', 'sluice:reply:*')) as string[]).length === 1,
          'the gateway to listen on its reply channel again',
        );
      } finally {
        client.disconnect();
      }
      dispatcher.process.child.kill('SIGCONT');
      const res = await answer;
      const text = await res.text();
      const logs = [gateway, dispatcher]
        .map((p) => p.process.output.slice(-25).join('\n'))
        .join('\n---\n');
      expect(res.status, `${res.headers.get('x-sluice-reject-reason')}: ${text}\n${logs}`).toBe(
        200,
      );
      expect((JSON.parse(text) as { object: string }).object).toBe('chat.completion');
    } finally {
      dispatcher.process.child.kill('SIGCONT');
      await gateway.stop();
    }
  });

  it('Redis back empty: the client whose queued job vanished gets 503 queue_lost with Retry-After, not a wait to the park limit', async () => {
    // The park limit and the grace are far past the test's time-out: only the parked-job
    // watch can answer this client in time.
    const gateway = await startGateway({
      ...env,
      SLUICE_REDIS_LOSS_GRACE_SECONDS: '600',
      ADMISSION_MAX_PARK_SECONDS: '600',
    });
    try {
      const { answer } = await queueWithDispatcherStopped(gateway);
      await restartRedis(false);
      await gateway.process.waitForLine(/"msg":"reply connection back"/);
      dispatcher.process.child.kill('SIGCONT');
      const res = await answer;
      expect(res.status).toBe(503);
      expect(res.headers.get('x-sluice-reject-reason')).toBe('queue_lost');
      expect(Number(res.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);
      expect(((await res.json()) as { error: { code: string } }).error.code).toBe('queue_lost');
      // Service resumes by itself.
      await eventually(async () => {
        const next = await chat(gateway.url, 'after', { max_tokens: 2 });
        return next.status === 200 ? true : undefined;
      }, 'service to resume');
    } finally {
      dispatcher.process.child.kill('SIGCONT');
      await gateway.stop();
    }
  });

  it('Redis lost past the grace: the running stream gets an in-band error, the queued client 503 redis_unavailable, new requests 503; the engine request is cancelled once Redis is back', async () => {
    const gateway = await startGateway({
      ...env,
      SLUICE_REDIS_LOSS_GRACE_SECONDS: '1',
      ADMISSION_MAX_PARK_SECONDS: '600',
    });
    try {
      await eventually(async () => {
        const res = await chat(gateway.url, 'warm-up', { max_tokens: 2 });
        return res.status === 200 ? true : undefined;
      }, 'a leading dispatcher serving');
      // An endless stream holds the only slot; a second request waits in the queue.
      const stream = await chat(gateway.url, 'endless', {
        stream: true,
        max_tokens: 130_000,
        ignore_eos: true,
      });
      expect(stream.status).toBe(200);
      const ending = readAll(stream);
      await eventually(
        async () => ((await sim.state()).running === 1 ? true : undefined),
        'the stream on the engine',
      );
      const queued = chat(gateway.url, 'queued', { max_tokens: 4 });
      const client = new Redis(redis.url);
      await eventually(
        async () => ((await queuedJobs(client)) === 1 ? true : undefined),
        'one queued job',
      );
      client.disconnect();

      await redis.process.stop('SIGKILL');

      const refused = await queued;
      expect(refused.status).toBe(503);
      expect(refused.headers.get('x-sluice-reject-reason')).toBe('redis_unavailable');
      expect(Number(refused.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);
      expect(await ending).toMatch(
        /data: \{"error":\{"message":"[^"]+","type":"server_error","param":null,"code":"redis_unavailable"\}\}\n\ndata: \[DONE\]\n\n$/,
      );
      const during = await chat(gateway.url, 'during', { max_tokens: 2 });
      expect(during.status).toBe(503);
      expect(during.headers.get('x-sluice-reject-reason')).toBe('redis_unavailable');
      expect(Number(during.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);

      redis = await startRedis({ port: redis.port });
      await eventually(
        async () => ((await sim.state()).running === 0 ? true : undefined),
        'the engine to drop the orphaned stream',
      );
      await eventually(async () => {
        const next = await chat(gateway.url, 'after', { max_tokens: 2 });
        return next.status === 200 ? true : undefined;
      }, 'service to resume');
    } finally {
      await gateway.stop();
    }
  });
});
