// Replica liveness against a real redis-server: a missing key means a dead replica only once
// Redis has been reachable for a whole replica TTL.
import { keySpace } from '@sluice/protocol';
import { createRedis, redisReady, type Redis } from '@sluice/redis';
import { startRedis, type TestRedis } from '@sluice/test/support';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ReplicaLiveness } from '../src/replicas.ts';

let server: TestRedis;
let redis: Redis;
const keys = keySpace('replicas-test');

beforeAll(async () => {
  server = await startRedis();
  redis = createRedis(server.url, { name: 'test', role: 'command' });
  redis.on('error', () => {});
  await redisReady(redis);
});
afterAll(async () => {
  await redis.quit();
  await server.stop();
});

describe('replica liveness', () => {
  it('reads the liveness key once Redis has been reachable for a TTL', async () => {
    let clock = 1_000;
    const replicas = new ReplicaLiveness(redis, keys, 0, 3_000, () => clock);
    await redis.set(keys.replicaAlive('up'), '1', 'PX', 60_000);
    clock += 3_000;
    expect(replicas.settled()).toBe(true);
    expect(await replicas.isAlive('up')).toBe(true);
    expect(await replicas.isAlive('gone')).toBe(false);
  });

  it('counts every replica alive right after Redis came back: live ones have not beaten yet', async () => {
    let clock = 1_000;
    const replicas = new ReplicaLiveness(redis, keys, 0, 3_000, () => clock);
    clock += 3_000;
    expect(replicas.settled()).toBe(true);
    // Redis restarts empty on its port; the connection comes back by itself.
    const back = new Promise((resolve) => redis.once('ready', resolve));
    await server.stop();
    server = await startRedis({ port: server.port });
    await back;
    expect(replicas.settled()).toBe(false);
    expect(await replicas.isAlive('not-beaten-yet')).toBe(true);
    clock += 2_999;
    expect(await replicas.isAlive('not-beaten-yet')).toBe(true);
    clock += 1;
    expect(await replicas.isAlive('not-beaten-yet')).toBe(false);
  });
});
