// A gateway listens at once and becomes ready by itself when Redis, a leading dispatcher and
// its engine's model name appear, in any order, without a restart. Until then it answers:
// /healthz 200, /readyz 503 saying what is missing, completions 503 with Retry-After. A wrong
// Redis password is the one fatal start-up error: one line on stderr, exit code 1.
import { describe, expect, it } from 'vitest';
import {
  eventually,
  freePort,
  sluiceBin,
  startDispatcher,
  startEngineSim,
  startProcess,
  startRedis,
  type StartedProcess,
  stoppedAfterEach,
} from '../support/index.ts';

const cleanup = stoppedAfterEach();

/** A gateway that has printed `gateway listening` (not `gateway ready`). */
async function listeningGateway(env: Record<string, string>) {
  const proc = await startProcess({
    command: process.execPath,
    args: [sluiceBin, 'gateway'],
    env: { LOG_LEVEL: 'info', HOST: '127.0.0.1', PORT: '0', ...env },
    ready: /"url":"([^"]+)".*"msg":"gateway listening"/,
  });
  cleanup.push(proc);
  return { url: proc.ready[1]!, proc };
}

const chat = JSON.stringify({ model: 'm', messages: [{ role: 'user', content: 'hi' }] });

function complete(url: string) {
  return fetch(`${url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: chat,
  });
}

async function readyz(url: string, query = '') {
  const res = await fetch(`${url}/readyz${query}`);
  return { status: res.status, body: (await res.json()) as Record<string, unknown> };
}

async function expectRefused(res: Response, reason: string) {
  expect(res.status).toBe(503);
  expect(res.headers.get('x-sluice-reject-reason')).toBe(reason);
  expect(Number(res.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);
  const body = (await res.json()) as { error: { code: string; type: string; message: string } };
  expect(body.error.code).toBe(reason);
  expect(body.error.type).toBe('server_error');
}

describe('gateway start-up', () => {
  it('listens before Redis is there and becomes ready when Redis and a dispatcher appear', async () => {
    const redisPort = await freePort();
    const redisUrl = `redis://127.0.0.1:${redisPort}`;
    const sim = await startEngineSim(['--profile', 'instant', '--model', 'm']);
    cleanup.push(sim);
    const env = { REDIS_URL: redisUrl, VLLM_URL: sim.url, VLLM_MODEL: 'm' };
    const { url, proc } = await listeningGateway(env);

    expect((await fetch(`${url}/healthz`)).status).toBe(200);
    expect(await readyz(url)).toEqual({
      status: 503,
      body: { redis: false, replies: true, leaders: {}, models: true },
    });
    await expectRefused(await complete(url), 'redis_unavailable');
    // What is this replica's own (Kubernetes' readiness probe): it answers clients, with 503
    // and Retry-After, so it stays in the Service while the shared Redis is away.
    expect(await readyz(url, '?scope=replica')).toEqual({
      status: 200,
      body: { draining: false },
    });
    expect((await readyz(url, '?scope=everything')).status).toBe(400);

    const redis = await startRedis({ port: redisPort });
    cleanup.push(redis);
    await proc.waitForLine(/"msg":"gateway ready"/, 30_000);
    // Redis, but no dispatcher yet: not ready, and a request says why.
    await eventually(async () => (await readyz(url)).body['redis'] === true, 'redis: true');
    expect(await readyz(url)).toEqual({
      status: 503,
      body: { redis: true, replies: true, leaders: { default: false }, models: true },
    });
    await expectRefused(await complete(url), 'no_leader');

    cleanup.push(await startDispatcher(env));
    await eventually(async () => (await readyz(url)).status === 200, '/readyz 200');
    const res = await complete(url);
    expect(res.status).toBe(200);
    expect(((await res.json()) as { object: string }).object).toBe('chat.completion');
  });

  it('learns the model from an engine that starts after it, answering 503 meanwhile', async () => {
    const redis = await startRedis();
    cleanup.push(redis);
    const simPort = await freePort();
    const env = { REDIS_URL: redis.url, VLLM_URL: `http://127.0.0.1:${simPort}` };
    cleanup.push(await startDispatcher({ ...env, VLLM_MODEL: 'm' }));
    const { url, proc } = await listeningGateway(env);

    await eventually(async () => (await readyz(url)).body['redis'] === true, 'redis: true');
    const { status, body } = await readyz(url);
    expect(status).toBe(503);
    expect(body['models']).toBe(false);
    await expectRefused(await complete(url), 'engine_unreachable');
    expect(((await (await fetch(`${url}/v1/models`)).json()) as { data: unknown[] }).data).toEqual(
      [],
    );

    const sim = await startEngineSim([
      '--profile',
      'instant',
      '--model',
      'm',
      '--port',
      `${simPort}`,
    ]);
    cleanup.push(sim);
    await proc.waitForLine(/"msg":"gateway ready"/, 30_000);
    await eventually(async () => (await readyz(url)).status === 200, '/readyz 200');
    expect((await complete(url)).status).toBe(200);
  });

  it('exits with code 1 and one line on stderr naming the cause when the Redis password is wrong', async () => {
    const redis = await startRedis({ password: 'right' });
    cleanup.push(redis);
    const gateway: StartedProcess = await startProcess({
      command: process.execPath,
      args: [sluiceBin, 'gateway'],
      env: {
        LOG_LEVEL: 'info',
        HOST: '127.0.0.1',
        PORT: '0',
        REDIS_URL: redis.url.replace(':right@', ':wrong@'),
        VLLM_URL: 'http://127.0.0.1:9',
        VLLM_MODEL: 'm',
      },
      ready: /"msg":"gateway listening"/,
    });
    cleanup.push(gateway);
    const code = await new Promise<number | null>((resolve) => {
      if (gateway.child.exitCode !== null) resolve(gateway.child.exitCode);
      else gateway.child.once('exit', (c) => resolve(c));
    });
    expect(code).toBe(1);
    const stderr = gateway.output.filter((line) => line.startsWith('sluice gateway:'));
    expect(stderr).toHaveLength(1);
    expect(stderr[0]).toMatch(/refused the credentials/);
    expect(stderr[0]).toMatch(/WRONGPASS|invalid password|invalid username-password/i);
  });
});
