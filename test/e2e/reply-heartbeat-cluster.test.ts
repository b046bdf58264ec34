// A gateway whose reply subscriber sits on a Redis Cluster node that hangs (SIGSTOP). Nothing
// closes and the command connection answers (its PINGs and PUBLISHes go to masters; the
// hung node is a replica), so before the reply-channel heartbeat nothing showed it: /readyz
// answered 200 and requests were taken while their reply frames went nowhere, until the
// cluster marked the node failed and ioredis moved the subscriber (cluster-node-timeout, 5 s
// here, and a slot-map read). The heartbeat (apps/gateway/src/reply-heartbeat.ts) PUBLISHes to
// the replica's own heartbeat channel every half second: one acknowledged by Redis that has not
// come back past the bound makes /readyz say `replies: false` (503), refuses new requests with
// redis_unavailable, and moves the subscriber to another node, after which the gateway serves
// again. Every client held meanwhile gets an answer: none hangs.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  answer,
  askNode,
  chat,
  eventually,
  metricSum,
  startCluster,
  startDispatcher,
  startEngineSim,
  startGateway,
  untilReady,
  type Answer,
  type RedisNode,
  type SluiceProcess,
  type TestCluster,
  type TestEngineSim,
} from '../support/index.ts';

let cluster: TestCluster;
let sim: TestEngineSim;
let dispatcher: SluiceProcess;
let gateway: SluiceProcess;
/** The node the test stopped, continued before anything is stopped. */
let stopped: RedisNode | undefined;

beforeAll(async () => {
  cluster = await startCluster({ replicas: true });
  // 20 ms a token: a stream of 100,000 tokens outlasts the test by far.
  sim = await startEngineSim([
    '--profile',
    'instant',
    '--model',
    'm',
    '--max-num-seqs',
    '64',
    '--decode-seconds-per-sequence',
    '0.02',
  ]);
  const env = {
    ...cluster.env,
    VLLM_URL: sim.url,
    VLLM_MODEL: 'm',
    ADMISSION_MAX_INFLIGHT: '8',
    VLLM_MAX_QUEUE_DEPTH: '1000',
    SLUICE_DEGRADATION: 'off',
    NODE_OPTIONS: '--unhandled-rejections=strict',
  };
  dispatcher = await startDispatcher(env);
  await dispatcher.process.waitForLine(/lease acquired/, 60_000);
  gateway = await startGateway(env);
  await untilReady(gateway);
}, 180_000);

afterAll(async () => {
  stopped?.process.child.kill('SIGCONT');
  await gateway?.stop();
  await dispatcher?.stop();
  await sim?.stop();
  await cluster?.stop();
});

interface Client {
  port: number;
  id: string;
  name: string;
  /** Channels it is subscribed to. */
  sub: number;
}

/** Every connection named by a Sluice process on every running node (CLIENT LIST). */
async function sluiceClients(): Promise<Client[]> {
  const nodes = [...cluster.nodes, ...cluster.replicas].filter((n) => n !== stopped);
  const lists = await Promise.all(
    nodes.map(async (node) => ({
      port: node.port,
      text: String(await askNode(node.port, (r) => r.call('CLIENT', 'LIST'))),
    })),
  );
  return lists.flatMap(({ port, text }) =>
    text
      .split('\n')
      .map((line) => Object.fromEntries(line.split(' ').map((kv) => kv.split('=', 2))))
      .filter((f: Record<string, string>) => f['name']?.includes('sluice:'))
      .map((f: Record<string, string>) => ({
        port,
        id: f['id']!,
        name: f['name']!,
        sub: Number(f['sub'] ?? 0),
      })),
  );
}

/**
 * Moves the gateway's subscriber until it sits on a replica with no other Sluice subscriber
 * (the dispatcher's, which hears the cancels): a hung replica then takes nothing from Sluice
 * but the gateway's replies. ioredis picks the subscriber's node at random among all of them;
 * a connection killed here is replaced on another random pick.
 */
async function subscriberOnAReplicaOfItsOwn(): Promise<RedisNode> {
  const replicaPorts = new Set(cluster.replicas.map((r) => r.port));
  const port = await eventually(
    async () => {
      const subscribers = (await sluiceClients()).filter((c) => c.sub > 0);
      const mine = subscribers.filter((c) => c.name.includes(':gateway:'));
      // Between a kill and the new subscription.
      if (mine.length !== 1) return undefined;
      const at = mine[0]!;
      const shared = subscribers.some((c) => c !== at && c.port === at.port);
      if (replicaPorts.has(at.port) && !shared) return at.port;
      await askNode(at.port, (r) => r.call('CLIENT', 'KILL', 'ID', at.id));
      return undefined;
    },
    "the gateway's subscriber on a replica of its own",
    60_000,
  );
  return cluster.replicas.find((r) => r.port === port)!;
}

/** Opens an endless stream and resolves once its first event arrived, with the rest to come. */
async function openStream(base: string) {
  const res = await chat(base, 'running', { stream: true, max_tokens: 100_000, ignore_eos: true });
  expect(res.status).toBe(200);
  const reader = res.body!.getReader();
  const decoder = new TextDecoder();
  let text = '';
  while (!text.includes('data: ')) {
    const { value, done } = await reader.read();
    if (done) break;
    text += decoder.decode(value, { stream: true });
  }
  const rest = (async () => {
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) return text;
        text += decoder.decode(value, { stream: true });
      }
    } catch (err) {
      return `${text}\ntransport error: ${String(err)}`;
    }
  })();
  return { rest };
}

interface Readiness {
  /** 0: no answer. */
  status: number;
  body: { redis?: boolean; replies?: boolean };
}

/** Asks /readyz back to back until stopped: every answer, in order. */
function pollReadiness(url: string) {
  const answers: Readiness[] = [];
  let polling = true;
  const poller = (async () => {
    while (polling) {
      try {
        const res = await fetch(`${url}/readyz`);
        answers.push({ status: res.status, body: (await res.json()) as Readiness['body'] });
      } catch {
        answers.push({ status: 0, body: {} });
      }
    }
  })();
  return {
    answers,
    async stop() {
      polling = false;
      await poller;
    },
  };
}

/** How often the gateway found its subscriber deaf (0 before the first time). */
const deafCount = async () =>
  (await metricSum(gateway.url, 'sluice_reply_channel_deaf_total')) ?? 0;

/** The reasons a client sent into the hang may be refused with. */
const ALLOWED = ['redis_unavailable', 'queue_lost', 'frame_lost'];

/**
 * Waits, after the node under the subscriber was stopped, for the gateway to find its
 * subscriber deaf: counted in sluice_reply_channel_deaf_total. /readyz says 503, `replies:
 * false`, while the deafness lasts, which may be milliseconds only: the recycled subscriber
 * usually lands on a running node, where the next heartbeat ends it, and a loaded machine's
 * poller can miss that; the count cannot.
 *
 * Fails at once if the subscriber shows on a running node with no deafness counted: ioredis
 * moved it off the stopped node by itself, and nothing of the gateway's hung. That happened
 * while the cluster's nodes had not all heard the replica's replication offset (startCluster
 * now waits for it): a slot map read from such a node leaves the replica out, and ioredis
 * drops it with the subscriber on it.
 */
async function untilDeaf(deafBefore: number): Promise<void> {
  const outcome = await eventually(
    async () => {
      // Where the subscriber is first, then the count: the gateway counts a deafness before
      // its recycle moves the subscriber, so a subscriber seen moved with the count unchanged
      // after it was not moved by the gateway.
      const seenMoved = (await sluiceClients()).some(
        (c) => c.sub > 0 && c.name.includes(':gateway:'),
      );
      if ((await deafCount()) > deafBefore) return 'deaf' as const;
      return seenMoved ? ('moved' as const) : undefined;
    },
    'the gateway to find its reply subscriber deaf',
    60_000,
  );
  expect(outcome, 'ioredis moved the subscriber off the stopped node by itself').toBe('deaf');
}

describe("the node under the gateway's reply subscriber hangs", () => {
  it('finds it deaf (/readyz 503, replies: false, while that lasts), moves the subscriber and serves again; no client hangs', async () => {
    const node = await subscriberOnAReplicaOfItsOwn();
    // Served where the subscriber sits now.
    expect((await answer(chat(gateway.url, 'before', { max_tokens: 4 }))).status).toBe(200);
    const running = await openStream(gateway.url);
    const deafBefore = await deafCount();

    // /readyz asked back to back from before the hang until the gateway serves again.
    const readiness = pollReadiness(gateway.url);
    // Sent into the hang, before the gateway can know: their replies may go nowhere.
    let during: Promise<Answer>[];
    try {
      stopped = node;
      node.process.child.kill('SIGSTOP');
      during = Array.from({ length: 3 }, (_, i) =>
        answer(chat(gateway.url, `during the hang ${i}`, { max_tokens: 4 })),
      );
      await untilDeaf(deafBefore);
      await gateway.process.waitForLine(/reply channel deaf/);

      // The subscriber moved (the node is still stopped): served again.
      const served = await eventually(
        async () => {
          const a = await answer(chat(gateway.url, 'after the move', { max_tokens: 4 }));
          return a.status === 200 ? a : undefined;
        },
        'a request served while the node is still stopped',
        60_000,
      );
      expect(served.body).toContain('"choices"');
      await eventually(
        () => (readiness.answers.at(-1)?.status === 200 ? true : undefined),
        '/readyz to answer 200 again',
      );
    } finally {
      await readiness.stop();
    }
    // Not ready only for the deafness: nothing else failed meanwhile.
    for (const r of readiness.answers.filter((r) => r.status !== 200))
      expect(r, JSON.stringify(r)).toMatchObject({ status: 503, body: { replies: false } });

    // No client hangs: each request sent into the hang ended, served or refused with a reason.
    for (const a of await Promise.all(during)) {
      if (a.status === 200) continue;
      expect(a.status, a.body).toBe(503);
      expect(ALLOWED, a.body).toContain(a.reason);
    }
    // The stream lost frames to the hang: it ends with an in-band error, not a silent cut.
    const text = await running.rest;
    const events = text.split('\n').filter((l) => l.startsWith('data: '));
    expect(events.at(-1), text.slice(-500)).toBe('data: [DONE]');
    const error = JSON.parse(events.at(-2)!.slice('data: '.length)) as {
      error: { code: string };
    };
    expect(ALLOWED).toContain(error.error.code);
  }, 180_000);
});
