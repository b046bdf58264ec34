// A pool's BullMQ queue on a real redis-server, with a worker that takes jobs by hand the
// way the release loop does, for the tests of the dispatcher's queue-side parts.
import { keySpace, type KeySpace } from '@sluice/protocol';
import { createRedis, redisReady, type Redis } from '@sluice/redis';
import { startRedis, type TestRedis } from '@sluice/test/support';
import { Queue, Worker } from 'bullmq';

export interface QueueFixture {
  keys: KeySpace;
  server: TestRedis;
  /** Command connection. */
  redis: Redis;
  /** BullMQ's connection, shared by the queue and the worker. */
  bull: Redis;
  queue: Queue;
  worker: Worker;
  close(): Promise<void>;
}

export async function startQueueFixture(prefix: string, pool = 'p'): Promise<QueueFixture> {
  const keys = keySpace(prefix);
  const server = await startRedis();
  const redis = createRedis(server.url, { name: 'cmd', role: 'command' });
  const bull = createRedis(server.url, { name: 'bull', role: 'bullmq' });
  await Promise.all([redisReady(redis), redisReady(bull)]);
  const queue = new Queue(keys.queueName(pool), { connection: bull, prefix: keys.prefix });
  const worker = new Worker(keys.queueName(pool), null, {
    connection: bull,
    prefix: keys.prefix,
    autorun: false,
  });
  return {
    keys,
    server,
    redis,
    bull,
    queue,
    worker,
    async close() {
      await worker.close();
      await queue.close();
      await Promise.all([redis.quit(), bull.quit()]);
      await server.stop();
    },
  };
}
