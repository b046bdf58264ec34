// The relay's deafness, which the e2e tests read as a subscriber's: a connection named for it
// stays open and hears nothing more; one that connects while it lasts is answered up to its
// subscriptions, then hears nothing; other connections hear everything.
import { once } from 'node:events';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { eventually } from './engine-sim.ts';
import { startRedis, type TestRedis } from './redis.ts';
import { startRedisRelay, type RedisRelay } from './relay.ts';

let redis: TestRedis;
let relay: RedisRelay;
const open: Redis[] = [];

beforeAll(async () => {
  redis = await startRedis();
  relay = await startRedisRelay(redis.port);
});

afterAll(async () => {
  open.forEach((c) => c.disconnect());
  await relay?.stop();
  await redis?.stop();
});

const connection = (url: string, name?: string) => {
  const conn = new Redis(url, { maxRetriesPerRequest: null, connectionName: name });
  conn.on('error', () => {});
  open.push(conn);
  return conn;
};

/** A subscriber through the relay, on channels `a` and `b`; its messages, in order. */
async function subscriber(name: string) {
  const conn = connection(relay.url, name);
  const heard: string[] = [];
  conn.on('message', (_channel: string, message: string) => heard.push(message));
  await conn.subscribe('a', 'b');
  return { conn, heard };
}

/** Publishes `message` on `a`; resolves once `witness` has heard it. */
async function publishHeardBy(publisher: Redis, witness: Redis, message: string) {
  const heard = new Promise<void>((resolve) => {
    const on = (_channel: string, m: string) => {
      if (m !== message) return;
      witness.off('message', on);
      resolve();
    };
    witness.on('message', on);
  });
  await publisher.publish('a', message);
  await heard;
}

describe('startRedisRelay: deafen', () => {
  it('silences named connections, open and new, and nothing else; ending it closes them, and they hear again', async () => {
    const publisher = connection(redis.url);
    const deafOne = await subscriber('gw:replies');
    const other = await subscriber('gw:cancel');
    await publishHeardBy(publisher, deafOne.conn, 'first');

    relay.deafen({ name: ':replies', subscriptions: 2 });
    await publishHeardBy(publisher, other.conn, 'second');
    // A new connection so named: its handshake and SUBSCRIBE are answered (it is ready), then
    // nothing.
    const deafTwo = await subscriber('gw2:replies');
    await publishHeardBy(publisher, other.conn, 'third');
    expect(deafOne.heard).toEqual(['first']);
    expect(deafTwo.heard).toEqual([]);
    expect([deafOne.conn.status, deafTwo.conn.status]).toEqual(['ready', 'ready']);

    const closed = once(deafOne.conn, 'close');
    relay.deafen(undefined);
    await closed;
    // ioredis reconnects and subscribes again, and hears from then on (published until heard:
    // the resubscription is on its way).
    await eventually(async () => {
      await publisher.publish('a', 'fourth');
      return deafOne.heard.includes('fourth') ? true : undefined;
    }, 'the reconnected subscriber to hear');
    expect(deafOne.heard[0]).toBe('first');
    expect(other.heard.slice(0, 4)).toEqual(['first', 'second', 'third', 'fourth']);
  });
});
