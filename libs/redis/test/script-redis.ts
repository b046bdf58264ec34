// The real redis-server the tests of Sluice's additions to BullMQ's scripts run on: one per
// test file, flushed before each test, stopped after the file.
import { startRedis, type TestRedis } from '@sluice/test/support';
import { afterAll, beforeAll, beforeEach } from 'vitest';
import { createRedis, redisReady, type Redis } from '../src/index.ts';

export interface ScriptRedis {
  /** The server's address, for a connection of the test's own. */
  readonly url: string;
  /** A connection to it, in BullMQ's role. */
  readonly redis: Redis;
}

/** Registers the file's server with vitest; read its fields inside hooks and tests. */
export function useScriptRedis(name: string): ScriptRedis {
  let server: TestRedis | undefined;
  let redis: Redis | undefined;
  beforeAll(async () => {
    server = await startRedis();
    redis = createRedis(server.url, { name, role: 'bullmq' });
    await redisReady(redis);
  });
  beforeEach(() => redis!.flushall());
  afterAll(async () => {
    await redis?.quit();
    await server?.stop();
  });
  return {
    get url() {
      return server!.url;
    },
    get redis() {
      return redis!;
    },
  };
}
