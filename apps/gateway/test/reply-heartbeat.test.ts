// The reply-channel heartbeat (reply-heartbeat.ts) and what the loss watch makes of it
// (redis-loss.ts), on a real redis-server. The subscriber reaches Redis through a relay whose
// open connections can be frozen: bytes stop both ways and nothing closes, as under a hung
// cluster node or a NAT that dropped the connection's state; connections made afterwards flow.
// The publisher connects directly, so Redis keeps acknowledging every heartbeat. The
// heartbeat's clock is the test's own: the timer never fires (an interval of an hour), each
// tick is called and awaited, and waits are for events (a heartbeat heard, a reconnect).
import { once } from 'node:events';
import { createRedis, redisReady, type Redis } from '@sluice/redis';
import {
  eventually,
  startRedis,
  startRedisRelay,
  type RedisRelay,
  type TestRedis,
} from '@sluice/test/support';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { ReplyLossWatch, type LossCause } from '../src/redis-loss.ts';
import { deafAfterMs, ReplyHeartbeat } from '../src/reply-heartbeat.ts';

const CHANNEL = 'test:reply-heartbeat:gw-1';
const DEAF_MS = 2000;
const GRACE_MS = 4000;
const HOUR = 3_600_000;

let server: TestRedis;

beforeAll(async () => {
  server = await startRedis();
});

afterAll(async () => {
  await server?.stop();
});

describe('ReplyHeartbeat', () => {
  let relay: RedisRelay;
  let publisher: Redis;
  let subscriber: Redis;
  let hb: ReplyHeartbeat;
  let loss: ReplyLossWatch | undefined;
  let t: number;
  let answering: boolean;
  let deafCalls: number[];
  let heardCalls: number;

  beforeEach(async () => {
    relay = await startRedisRelay(server.port);
    publisher = createRedis(server.url, { name: 'hb-test:command', role: 'command' });
    subscriber = createRedis(relay.url, {
      name: 'hb-test:replies',
      role: 'subscriber',
    });
    subscriber.on('error', () => {});
    await Promise.all([redisReady(publisher), redisReady(subscriber)]);
    t = 1_000_000;
    answering = true;
    deafCalls = [];
    heardCalls = 0;
    hb = new ReplyHeartbeat({
      publisher,
      subscriber,
      channel: CHANNEL,
      deafMs: DEAF_MS,
      intervalMs: HOUR,
      answering: () => answering,
      now: () => t,
      onDeaf: (silentMs) => deafCalls.push(silentMs),
      onHeard: () => (heardCalls += 1),
    });
    await hb.start();
  });

  afterEach(async () => {
    loss?.stop();
    loss = undefined;
    hb.stop();
    publisher.disconnect();
    subscriber.disconnect();
    await relay.stop();
  });

  /** Resolves once the subscriber has delivered the next heartbeat (after the heartbeat did). */
  function nextHeard(): Promise<void> {
    return new Promise((resolve) => {
      const on = (channel: Buffer) => {
        if (channel.toString() !== CHANNEL) return;
        subscriber.off('messageBuffer', on);
        resolve();
      };
      subscriber.on('messageBuffer', on);
    });
  }

  /** A tick whose heartbeat comes back. */
  async function beat(): Promise<void> {
    const heard = nextHeard();
    await hb.tick();
    await heard;
  }

  /** Ticks until a heartbeat is heard (a reconnected subscriber subscribes again first). */
  async function untilHeard(): Promise<void> {
    await eventually(async () => {
      await hb.tick();
      return hb.deaf ? undefined : true;
    }, 'a heartbeat heard again');
  }

  it('derives its bound from the loss grace and the silence timeout: half the shorter, 1 s at least', () => {
    expect(deafAfterMs(4000, 5000)).toBe(2000);
    expect(deafAfterMs(10_000, 3000)).toBe(1500);
    expect(deafAfterMs(500, 5000)).toBe(1000);
  });

  it('is not deaf while its heartbeats come back, however long between them', async () => {
    await beat();
    t += HOUR / 2;
    await beat();
    t += HOUR / 2;
    await beat();
    expect(hb.deaf).toBe(false);
    expect(deafCalls).toEqual([]);
    expect(hb.heardAt).toBe(t);
  });

  it('finds a frozen subscriber deaf the bound after an acknowledged heartbeat, recycles it, and hears again', async () => {
    await beat();
    const lastHeard = t;
    relay.freeze();
    t += 500;
    await hb.tick(); // acknowledged by Redis, never delivered
    t += DEAF_MS - 1;
    await hb.tick();
    expect(hb.deaf).toBe(false);
    expect(subscriber.status).toBe('ready');

    const reconnected = once(subscriber, 'ready');
    const changes: boolean[] = [];
    hb.onChange((deaf) => changes.push(deaf));
    t += 1;
    await hb.tick();
    expect(hb.deaf).toBe(true);
    expect(deafCalls).toEqual([t - lastHeard]);
    expect(changes).toEqual([true]);
    // Recycled: the frozen socket was dropped and a new connection made through the relay.
    await reconnected;
    await untilHeard();
    expect(changes).toEqual([true, false]);
    expect(heardCalls).toBe(1);
    expect(deafCalls).toHaveLength(1);
  });

  it('recycles again, one bound later, a new connection just as deaf', async () => {
    await beat();
    relay.freeze();
    relay.refusing = true; // the recycled subscriber finds no way back either
    await hb.tick();
    t += DEAF_MS;
    await hb.tick();
    expect(deafCalls).toHaveLength(1);
    // Heartbeats acknowledged before the recycle say nothing of the next connection.
    t += 1;
    await hb.tick();
    expect(deafCalls).toHaveLength(1);
    relay.refusing = false;
    await once(subscriber, 'ready');
    relay.freeze();
    await hb.tick();
    t += DEAF_MS;
    await hb.tick();
    expect(deafCalls).toHaveLength(2);
    expect(hb.deaf).toBe(true);
    await untilHeard();
    expect(heardCalls).toBe(1);
  });

  it('judges nothing while the command connection does not answer the probe', async () => {
    await beat();
    relay.freeze();
    await hb.tick();
    answering = false;
    t += 10 * DEAF_MS;
    await hb.tick();
    expect(hb.deaf).toBe(false);
    answering = true;
    await hb.tick();
    expect(hb.deaf).toBe(true);
  });

  it('judges a reconnected subscriber afresh: heartbeats lost while it was away do not count', async () => {
    await beat();
    relay.refusing = true;
    const closed = once(subscriber, 'close');
    relay.cut();
    await closed;
    // Published while the subscriber is away: acknowledged, and heard by nobody.
    await hb.tick();
    relay.refusing = false;
    await once(subscriber, 'ready');
    t += DEAF_MS;
    await hb.tick();
    expect(hb.deaf).toBe(false);
    expect(deafCalls).toEqual([]);
  });

  it('does not judge at a tick that came late (its own event loop stalled), but at the next', async () => {
    await beat();
    relay.freeze();
    await hb.tick();
    // More than two intervals since the last tick: the process itself was stalled.
    t += 2 * HOUR + 1;
    await hb.tick();
    expect(hb.deaf).toBe(false);
    t += 1;
    await hb.tick();
    expect(hb.deaf).toBe(true);
  });

  it('makes the loss watch lose a deaf subscriber the grace after the last heartbeat heard, and find it back once one comes', async () => {
    const lost: LossCause[] = [];
    const back: boolean[] = [];
    let onLost!: () => void;
    const wasLost = new Promise<void>((resolve) => (onLost = resolve));
    loss = new ReplyLossWatch(subscriber, {
      graceMs: GRACE_MS,
      hearing: hb,
      now: () => t,
      onLost: (cause) => {
        lost.push(cause);
        onLost();
      },
      onBack: (afterLoss) => back.push(afterLoss),
    });
    await beat();
    expect(loss.listening).toBe(true);
    relay.freeze();
    relay.refusing = true; // no hearing before the grace is over
    await hb.tick();
    t += GRACE_MS;
    await hb.tick();
    expect(hb.deaf).toBe(true);
    expect(loss.listening).toBe(false);
    await wasLost;
    expect(lost).toEqual(['deaf']);
    // Reconnected: not back yet, nothing shows the new connection hears.
    relay.refusing = false;
    await once(subscriber, 'ready');
    expect(back).toEqual([]);
    await untilHeard();
    expect(back).toEqual([true]);
    expect(loss.listening).toBe(true);
    expect(lost).toEqual(['deaf']);
  });
});
