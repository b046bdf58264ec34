// A TCP relay in front of a redis-server, for the faults that leave a connection open: nothing
// closes and bytes stop, either way (a hung node, a NAT that dropped the connection's state),
// or from the server only, once a subscriber has subscribed (connected, subscribed, and deaf).
// Clients connect to `url`; each connection gets its own connection to the server.
import { once } from 'node:events';
import { connect, createServer, type Server, type Socket } from 'node:net';

export interface RedisRelay {
  port: number;
  /** `redis://127.0.0.1:<port>`. */
  url: string;
  /** Open connections pass nothing more, either way, and stay open. */
  freeze(): void;
  /** New connections are closed at once while true. */
  refusing: boolean;
  /** Closes every open connection. */
  cut(): void;
  /**
   * Connections named (CLIENT SETNAME) with `name` in their name hear nothing more from the
   * server (no message, no reply; what they send still goes): open ones at once, new ones once
   * they have `subscriptions` channels subscribed (their handshake and SUBSCRIBE are answered:
   * they are ready, and deaf). `undefined`: the deafened connections are closed (a message may
   * have been cut in half), and new ones hear.
   */
  deafen(deaf: { name: string; subscriptions: number } | undefined): void;
  stop(): Promise<void>;
}

interface Pair {
  client: Socket;
  upstream: Socket;
  frozen: boolean;
  /** The client's first bytes, where its CLIENT SETNAME is. */
  head: string;
  /** `until-subscribed`: server bytes seen since, searched for the last confirmation. */
  hearing: 'all' | 'until-subscribed' | 'nothing';
  seen: string;
  /** Channels to be subscribed before `until-subscribed` turns `nothing`. */
  subscriptions: number;
}

/** How many of a client's first bytes are searched for its name. */
const HEAD_BYTES = 1024;
/** A SUBSCRIBE confirmation (RESP2): ["subscribe", channel, channels subscribed now]. */
const CONFIRMATION = /\*3\r\n\$9\r\nsubscribe\r\n\$\d+\r\n[^\r]*\r\n:(\d+)\r\n/g;

export async function startRedisRelay(targetPort: number): Promise<RedisRelay> {
  const pairs: Pair[] = [];
  let deaf: { name: string; subscriptions: number } | undefined;
  const named = (pair: Pair) => deaf !== undefined && pair.head.includes(deaf.name);

  /** The part of `chunk` that the pair's client may still read. */
  function audible(pair: Pair, chunk: Buffer): Buffer | undefined {
    if (pair.hearing === 'all') return chunk;
    if (pair.hearing === 'nothing') return undefined;
    const before = pair.seen.length;
    pair.seen += chunk.toString('latin1');
    for (const match of pair.seen.matchAll(CONFIRMATION)) {
      if (Number(match[1]) < pair.subscriptions) continue;
      pair.hearing = 'nothing';
      return chunk.subarray(0, match.index + match[0].length - before);
    }
    return chunk;
  }

  const server: Server = createServer((client) => {
    client.on('error', () => {});
    if (relay.refusing) return void client.destroy();
    const upstream = connect(targetPort, '127.0.0.1');
    upstream.on('error', () => {});
    const pair: Pair = {
      client,
      upstream,
      frozen: false,
      head: '',
      hearing: 'all',
      seen: '',
      subscriptions: 0,
    };
    pairs.push(pair);
    client.on('data', (d: Buffer) => {
      if (pair.head.length < HEAD_BYTES) {
        pair.head += d.toString('latin1');
        if (pair.hearing === 'all' && named(pair)) {
          pair.hearing = 'until-subscribed';
          pair.subscriptions = deaf!.subscriptions;
        }
      }
      if (!pair.frozen) upstream.write(d);
    });
    upstream.on('data', (d: Buffer) => {
      const heard = pair.frozen ? undefined : audible(pair, d);
      if (heard !== undefined && heard.length > 0) client.write(heard);
    });
    const forget = () => {
      const at = pairs.indexOf(pair);
      if (at >= 0) pairs.splice(at, 1);
    };
    client.on('close', () => (upstream.destroy(), forget()));
    upstream.on('close', () => client.destroy());
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const address = server.address();
  if (address === null || typeof address === 'string') throw new Error('relay has no port');

  const relay: RedisRelay = {
    port: address.port,
    url: `redis://127.0.0.1:${address.port}`,
    refusing: false,
    freeze: () => pairs.forEach((p) => (p.frozen = true)),
    cut: () => [...pairs].forEach((p) => p.client.destroy()),
    deafen(next) {
      deaf = next;
      for (const pair of [...pairs]) {
        if (next === undefined && pair.hearing !== 'all') pair.client.destroy();
        else if (next !== undefined && named(pair)) pair.hearing = 'nothing';
      }
    },
    async stop() {
      [...pairs].forEach((p) => p.client.destroy());
      await new Promise((resolve) => server.close(resolve));
    },
  };
  return relay;
}
