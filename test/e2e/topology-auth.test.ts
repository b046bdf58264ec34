// Sluice on a Redis that checks who it is: a password (`redis://:pw@`), an ACL user with
// exactly the rules docs/redis.md tells an operator to grant, and TLS with a CA the test
// made (`rediss://` + REDIS_TLS_CA_FILE), and Sentinel and Cluster whose nodes want a
// password. Each serves requests end to end through a gateway and a dispatcher.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  answer,
  askNode,
  chat,
  startAclRedis,
  startCluster,
  startDispatcher,
  startEngineSim,
  startGateway,
  startRedis,
  startSentinel,
  startTlsRedis,
  type TestEngineSim,
  untilReady,
} from '../support/index.ts';

let sim: TestEngineSim;

beforeAll(async () => {
  sim = await startEngineSim(['--profile', 'instant', '--model', 'm']);
});

afterAll(() => sim?.stop());

/** Starts a dispatcher and a gateway on `redis`, serves a plain and a streaming request, stops. */
async function servesThrough(redis: Record<string, string>): Promise<void> {
  const env = {
    ...redis,
    VLLM_URL: sim.url,
    VLLM_MODEL: 'm',
    NODE_OPTIONS: '--unhandled-rejections=strict',
    // Every body in a key of its own (the admission script's SET, the dispatcher's GETDEL):
    // the commands a large prompt needs pass the ACL and land in the pool's slot too.
    SLUICE_BODY_KEY_MIN_BYTES: '0',
  };
  const dispatcher = await startDispatcher(env);
  try {
    const gateway = await startGateway(env);
    try {
      // Ready: Redis answers and the pool has a leader (the lease may take a moment on a cluster).
      await untilReady(gateway);
      const plain = await answer(
        chat(gateway.url, 'through an authenticated redis', { max_tokens: 4 }),
      );
      expect(plain.status).toBe(200);
      expect(JSON.parse(plain.body).choices[0].message.content).toMatch(/\w/);
      const streamed = await answer(
        chat(gateway.url, 'streamed through an authenticated redis', {
          max_tokens: 4,
          stream: true,
        }),
      );
      expect(streamed.status).toBe(200);
      expect(streamed.body.endsWith('data: [DONE]\n\n')).toBe(true);
    } finally {
      await gateway.stop();
    }
  } finally {
    await dispatcher.stop();
  }
}

describe('Redis that authenticates its clients', () => {
  it('a password in REDIS_URL', async () => {
    const redis = await startRedis({ password: 's3cret-pw' });
    try {
      expect(redis.url).toBe(`redis://:s3cret-pw@127.0.0.1:${redis.port}`);
      await servesThrough({ REDIS_URL: redis.url });
    } finally {
      await redis.stop();
    }
  });

  it('an ACL user with only the rules docs/redis.md documents', async () => {
    const redis = await startAclRedis();
    try {
      await servesThrough(redis.env);
      // Nothing Sluice tried was denied, not even an attempt it recovered from.
      expect(await askNode(redis.redis.port, (r) => r.call('ACL', 'LOG'))).toEqual([]);
    } finally {
      await redis.stop();
    }
  });

  it('Sentinel whose data nodes and sentinels both want a password (REDIS_PASSWORD, REDIS_SENTINEL_PASSWORD)', async () => {
    const sentinel = await startSentinel({ password: 'data-pw', sentinelPassword: 'sentinel-pw' });
    try {
      await servesThrough(sentinel.env);
    } finally {
      await sentinel.stop();
    }
  }, 120_000);

  it('a cluster whose nodes want a password (REDIS_PASSWORD)', async () => {
    const cluster = await startCluster({ password: 'cluster-pw' });
    try {
      await servesThrough(cluster.env);
    } finally {
      await cluster.stop();
    }
  }, 120_000);

  it('TLS with a test CA given in REDIS_TLS_CA_FILE', async () => {
    const redis = await startTlsRedis({ password: 'tls-pw' });
    try {
      expect(redis.env['REDIS_URL']).toMatch(/^rediss:\/\//);
      await servesThrough(redis.env);
    } finally {
      await redis.stop();
    }
  });
});
