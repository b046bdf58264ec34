// monitorRedis on a Redis that runs commands all the while, where ioredis's own monitor() can
// reject with a command queue state error (redis-monitor.ts).
import { Redis } from 'ioredis';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { monitorRedis } from './redis-monitor.ts';
import { startRedis, type TestRedis } from './redis.ts';

let server: TestRedis;
beforeAll(async () => {
  server = await startRedis();
});
afterAll(() => server.stop());

it('starts on a busy Redis, every time, and lists the commands run after it', async () => {
  const busy = new Redis(server.url);
  let going = true;
  const load = (async () => {
    while (going) await Promise.all([busy.set('k', 'v'), busy.set('k', 'v')]);
  })();
  try {
    for (let i = 0; i < 20; i += 1) {
      const monitor = await monitorRedis(server.url);
      const next = new Promise<string[]>((resolve) =>
        monitor.once('monitor', (_time: string, args: string[]) => resolve(args)),
      );
      expect(await next).toEqual(['set', 'k', 'v']);
      monitor.disconnect();
    }
  } finally {
    going = false;
    await load;
    busy.disconnect();
  }
});
