// A Redis that stops answering (SIGSTOP: the socket stays open, nothing comes back) never
// makes a request wait: new completions get 503 redis_unavailable with Retry-After, never a
// hang or the error handler's 500, and service resumes by itself after SIGCONT.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { eventually, startStack, type SluiceProcess, type Stack } from '../support/index.ts';

let stack: Stack;
let gateway: SluiceProcess;

beforeAll(async () => {
  stack = await startStack();
  ({ gateway } = stack);
});

afterAll(async () => {
  stack?.redis.process.child.kill('SIGCONT');
  await stack?.stop();
});

const body = JSON.stringify({ model: 'm', messages: [{ role: 'user', content: 'hi' }] });

function complete(signal?: AbortSignal) {
  return fetch(`${gateway.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body,
    ...(signal ? { signal } : {}),
  });
}

async function readyz() {
  return (await (await fetch(`${gateway.url}/readyz`)).json()) as { redis: boolean };
}

describe('Redis stops answering', () => {
  it('serves before the fault', async () => {
    expect((await complete()).status).toBe(200);
  });

  it('answers 503 redis_unavailable with Retry-After while Redis is stopped', async () => {
    stack.redis.process.child.kill('SIGSTOP');
    await eventually(async () => (await readyz()).redis === false, '/readyz to see Redis gone');
    for (let i = 0; i < 3; i++) {
      const res = await complete();
      expect(res.status).toBe(503);
      expect(res.headers.get('x-sluice-reject-reason')).toBe('redis_unavailable');
      expect(Number(res.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);
      const error = ((await res.json()) as { error: { code: string; type: string } }).error;
      expect(error).toMatchObject({ code: 'redis_unavailable', type: 'server_error' });
    }
    expect((await fetch(`${gateway.url}/healthz`)).status).toBe(200);
    // The series an alert can read through the outage (SluiceRedisUnreachable).
    const metrics = await (await fetch(`${gateway.url}/metrics`)).text();
    expect(metrics).toMatch(/^sluice_redis_up 0$/m);
    expect(metrics).not.toMatch(/^sluice_pool_has_leader/m);
  });

  it('serves again after SIGCONT, by itself', async () => {
    stack.redis.process.child.kill('SIGCONT');
    await eventually(async () => (await readyz()).redis === true, '/readyz to see Redis back');
    expect((await complete()).status).toBe(200);
    const metrics = await (await fetch(`${gateway.url}/metrics`)).text();
    expect(metrics).toMatch(/^sluice_redis_up 1$/m);
    expect(metrics).toMatch(/sluice_rejected_total\{model="m",reason="redis_unavailable"\} 3/);
    // The series exists from the start at 0 (primeRejected): it counted nothing.
    expect(metrics).not.toMatch(/reason="internal_error"[^}]*\} [1-9]/);
  });
});
