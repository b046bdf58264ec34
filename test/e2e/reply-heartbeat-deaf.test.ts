// A gateway whose reply subscriber is connected, subscribed, and hears nothing: its connection
// goes through a relay that passes it nothing from Redis once it has subscribed (a proxy or a
// NAT that lost the connection's state, on one Redis node). Redis acknowledges every heartbeat the
// gateway publishes over its command connection, which passes. While the deafness lasts,
// /readyz says so (503, `replies: false`) and new requests are refused, not taken for replies
// that would go nowhere; each recycled subscriber is just as deaf and is found so again; once
// messages pass again, the gateway serves. In the Cluster test (reply-heartbeat-cluster) the
// deafness ends as soon as the recycled subscriber lands on a running node; here it lasts
// until the test ends it, so what the gateway says meanwhile can be read.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  answer,
  chat,
  eventually,
  metricSum,
  startDispatcher,
  startEngineSim,
  startGateway,
  startRedis,
  startRedisRelay,
  untilReady,
  type RedisRelay,
  type SluiceProcess,
  type TestEngineSim,
  type TestRedis,
} from '../support/index.ts';

let redis: TestRedis;
let relay: RedisRelay;
let sim: TestEngineSim;
let dispatcher: SluiceProcess;
let gateway: SluiceProcess;

beforeAll(async () => {
  redis = await startRedis();
  relay = await startRedisRelay(redis.port);
  sim = await startEngineSim(['--profile', 'instant', '--model', 'm']);
  const env = {
    VLLM_URL: sim.url,
    VLLM_MODEL: 'm',
    SLUICE_DEGRADATION: 'off',
    NODE_OPTIONS: '--unhandled-rejections=strict',
  };
  dispatcher = await startDispatcher({ ...env, REDIS_URL: redis.url });
  await dispatcher.process.waitForLine(/lease acquired/, 60_000);
  gateway = await startGateway({ ...env, REDIS_URL: relay.url });
  await untilReady(gateway);
}, 120_000);

afterAll(async () => {
  await gateway?.stop();
  await dispatcher?.stop();
  await sim?.stop();
  await relay?.stop();
  await redis?.stop();
});

const deafCount = async () =>
  (await metricSum(gateway.url, 'sluice_reply_channel_deaf_total')) ?? 0;

async function readiness() {
  const res = await fetch(`${gateway.url}/readyz`);
  return { status: res.status, body: (await res.json()) as Record<string, unknown> };
}

describe('the reply subscriber hears nothing while its connection stays open', () => {
  it('/readyz says 503 replies: false and requests are refused while it lasts; a recycled subscriber as deaf is found again; then served', async () => {
    expect((await answer(chat(gateway.url, 'before', { max_tokens: 4 }))).status).toBe(200);
    const deafBefore = await deafCount();

    relay.deafen({ name: ':replies', subscriptions: 2 });
    await gateway.process.waitForLine(/reply channel deaf/);
    // Deaf from here until a heartbeat is heard, and none can be: no race with /readyz.
    const ready = await readiness();
    expect(ready.status).toBe(503);
    expect(ready.body).toMatchObject({ redis: false, replies: false });
    const refused = await answer(chat(gateway.url, 'while deaf', { max_tokens: 4 }));
    expect(refused.status, refused.body).toBe(503);
    expect(refused.reason).toBe('redis_unavailable');
    expect(refused.retryAfter).not.toBeNull();

    // The recycled subscriber reconnected, subscribed (the relay answers its SUBSCRIBE) and
    // hears nothing either: found deaf again, one bound later.
    await eventually(
      async () => ((await deafCount()) >= deafBefore + 2 ? true : undefined),
      'the recycled subscriber found deaf in turn',
    );
    expect((await readiness()).status).toBe(503);

    relay.deafen(undefined);
    await gateway.process.waitForLine(/reply channel heard again/);
    await untilReady(gateway, '/readyz 200 once the subscriber hears');
    expect((await readiness()).body).toMatchObject({ redis: true, replies: true });
    const served = await answer(chat(gateway.url, 'after', { max_tokens: 4 }));
    expect(served.status, served.body).toBe(200);
    expect(served.body).toContain('"choices"');
  }, 60_000);
});
