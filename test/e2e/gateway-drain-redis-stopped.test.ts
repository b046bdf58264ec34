// A gateway replica stopped with SIGTERM while Redis is stopped (SIGSTOP: its sockets stay
// open and the connections still say `ready`, but nothing answers). Closing BullMQ's queue
// and QUIT have no bound of their own; the replica must still exit by itself, within its
// grace period, rather than wait for Redis and be SIGKILLed by Kubernetes.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type Stack, startGateway, startStack, untilReady } from '../support/index.ts';

let stack: Stack;

beforeAll(async () => {
  stack = await startStack({ gateways: 0 });
});

afterAll(async () => {
  stack?.redis.process.child.kill('SIGCONT');
  await stack?.stop();
});

describe('gateway SIGTERM with Redis stopped', () => {
  it('exits by itself while Redis is still stopped, dropping the connections it cannot close', async () => {
    const gateway = await startGateway(stack.env);
    try {
      await untilReady(gateway);
      stack.redis.process.child.kill('SIGSTOP');
      gateway.process.child.kill('SIGTERM');
      // Redis gets SIGCONT only after this: an exit that waited for it would never come.
      const closed = await gateway.process.closed;
      expect(closed).toEqual({ code: 0, signal: null });
      expect(gateway.process.output.join('\n')).toContain('"msg":"redis connections dropped"');
    } finally {
      stack.redis.process.child.kill('SIGCONT');
      await gateway.stop('SIGKILL');
    }
  });
});
