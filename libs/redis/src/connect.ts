// One place that knows how Sluice talks to Redis: which ioredis client each topology needs
// (one node, Sentinel, Cluster) and which options each role needs.
import type { RedisTopology } from '@sluice/config';
import {
  Cluster,
  Redis as NodeRedis,
  type ClusterOptions,
  type Command,
  type RedisOptions,
} from 'ioredis';
import { readCa } from './tls.js';

export { list as listNodes };

/** A connection to Redis whatever the topology: one node (directly or through Sentinel) or a Cluster. */
export type Redis = NodeRedis | Cluster;

/** True for a Redis Cluster connection (its `nodes('master')` are the shards). */
export function isCluster(redis: Redis): redis is Cluster {
  return redis instanceof Cluster;
}

export type RedisRole =
  /** Commands on the request path: fail fast when Redis is away instead of queueing forever. */
  | 'command'
  /** Pub/sub subscriber: reconnects forever, resubscribes by itself. */
  | 'subscriber'
  /** Handed to BullMQ Queue/Worker: BullMQ requires maxRetriesPerRequest null. */
  | 'bullmq';

/**
 * The longest a command on the request path waits for Redis. A stopped or partitioned Redis
 * keeps the socket open and answers nothing; without a bound, every caller would hang with it.
 * A healthy Redis answers these small commands in well under a millisecond.
 */
export const COMMAND_TIMEOUT_MS = 1000;

/**
 * Commands that block their connection until data arrives. ioredis's auto-pipelining sends
 * one pipeline per connection at a time and holds what comes meanwhile until its replies are
 * in, so a blocking command in one would hold back every command behind it for as long as it
 * blocks; sent on their own they go out at once. BullMQ blocks (BZPOPMIN) only on the
 * connection it duplicates for that, which inherits these options.
 */
const BLOCKING_COMMANDS = [
  'blpop',
  'brpop',
  'brpoplpush',
  'blmove',
  'blmpop',
  'bzpopmin',
  'bzpopmax',
  'bzmpop',
  'xread',
  'xreadgroup',
  'wait',
  'waitaof',
];

/**
 * Commands the `command` role writes at once rather than in the turn's pipeline. PUBLISH: the
 * dispatcher's relay publishes a turn's reply frames as one bundle per gateway replica (one
 * or a few PUBLISHes per turn) and must have them on the wire before BullMQ records the job
 * complete; behind a pipeline still waiting for its replies they would wait a round trip.
 */
const WRITTEN_AT_ONCE = ['publish'];

/**
 * One pipeline per event-loop turn on the request path: ioredis's auto-pipelining gathers the
 * commands issued in a turn and sends them on `setImmediate`. It keeps one pipeline out per
 * connection and holds the next until the replies are in; fine for the request path's small
 * commands. Not for `bullmq`: measured there (overhead bench), that wait serialised every
 * take, completion and add of the process behind one round trip and cut the rate to a third;
 * BullMQ's connection writes once per turn by corking instead (`corkPerTurn`).
 */
const onePipelinePerTurn: RedisOptions = {
  enableAutoPipelining: true,
  autoPipeliningIgnoredCommands: [...BLOCKING_COMMANDS, ...WRITTEN_AT_ONCE],
};

/**
 * A Cluster's auto-pipeline is picked by the node of a command's first argument. For EVAL and
 * EVALSHA that is the script, not a key (ioredis 5.9 `autoPipelining.ts`, issue
 * redis/ioredis#2109): two pools' lease renewals in one turn share a pipeline whatever node
 * their keys are on, and the whole pipeline fails with "All keys in the pipeline should
 * belong to the same slots allocation group" (seen as a dispatcher that never led). Scripts
 * made with `defineCommand` go by their own names, keys first, and stay pipelined.
 */
const clusterPipelinePerTurn: RedisOptions = {
  ...onePipelinePerTurn,
  autoPipeliningIgnoredCommands: [
    ...(onePipelinePerTurn.autoPipeliningIgnoredCommands ?? []),
    'eval',
    'evalsha',
    'eval_ro',
    'evalsha_ro',
    'fcall',
    'fcall_ro',
  ],
};

const roleOptions: Record<RedisRole, RedisOptions> = {
  command: {
    maxRetriesPerRequest: 1,
    ...onePipelinePerTurn,
    commandTimeout: COMMAND_TIMEOUT_MS,
  },
  subscriber: { maxRetriesPerRequest: null },
  bullmq: { maxRetriesPerRequest: null, enableReadyCheck: true },
};

/**
 * One socket write per event-loop turn without waiting for replies: the socket is corked at
 * the first write of a turn and uncorked on `setImmediate`, so the commands of the turn leave
 * in one writev and the next turn's go out while these are still answered. Small writes were
 * the largest CPU item of the gateway and the dispatcher. Each reconnect brings a new socket.
 * BullMQ's blocking connection is a `duplicate()` made without this: it sends one BZPOPMIN at a
 * time, so there is nothing to gather.
 */
function corkPerTurn(redis: NodeRedis): NodeRedis {
  redis.on('connect', () => {
    const socket = redis.stream;
    const write = socket.write;
    const uncork = () => socket.uncork();
    socket.write = function (this: typeof socket, ...args: Parameters<typeof write>) {
      if (socket.writableCorked === 0) {
        socket.cork();
        setImmediate(uncork);
      }
      return write.apply(this, args);
    } as typeof write;
  });
  return redis;
}

/**
 * A connection Sluice did not close comes back. ioredis (5.9) ends a connection for good, with
 * no retry, when its connector is told to disconnect while it is still connecting: Redis
 * `connect` sets the status to `end` when the connector gives up (redis/Redis.js). Its Sentinel
 * failover detector does exactly that: when the sentinels announce the new master
 * (+switch-master) it calls the connector's `disconnect`, and the detector of a connection that
 * lost its master is still listening while that connection asks the sentinels where to go
 * (connectors/SentinelConnector: "Connection is closed."). Seen as a gateway answering
 * `redis_unavailable` for good after a Sentinel failover on a busy machine. BullMQ brings its
 * own blocking connection back the same way (its RedisConnection `reconnect`). Only `quit()`
 * and `disconnect()` close a connection for good; `disconnect(true)` reconnects.
 */
function comesBack(redis: NodeRedis): NodeRedis {
  let closedOnPurpose = false;
  const { quit, disconnect } = redis;
  redis.quit = function (this: NodeRedis, ...args: unknown[]) {
    closedOnPurpose = true;
    return (quit as (...a: unknown[]) => unknown).apply(this, args);
  } as typeof quit;
  redis.disconnect = function (this: NodeRedis, reconnect = false) {
    if (!reconnect) closedOnPurpose = true;
    disconnect.call(this, reconnect);
  };
  let attempt = 0;
  redis.on('ready', () => (attempt = 0));
  redis.on('end', () => {
    if (closedOnPurpose) return;
    setTimeout(() => {
      if (!closedOnPurpose && redis.status === 'end') redis.connect().catch(() => {});
    }, backoff(attempt++)).unref();
  });
  return redis;
}

export interface RedisConnectOptions {
  /** Shown by CLIENT LIST: `sluice:<component>:<id>:<role>`. */
  name: string;
  role: RedisRole;
}

// Back off up to 1 s between reconnects, so service resumes within about a second of Redis
// coming back; never give up: Redis restarts and failovers are routine.
const backoff = (attempt: number) => Math.min(50 * 2 ** attempt, 1000);

// A replica answers writes with READONLY: we are talking to a demoted master, and the socket
// would stay on it for good (nothing closes it). Reconnecting finds the master again: through
// Sentinel it asks the sentinels; on one node it resolves the host name again, which is how a
// managed service's primary endpoint (DNS that moves on failover) hands over. Resending is safe
// because the command was not executed. While the name still points at the replica, each
// resend meets READONLY and reconnects again (after `backoff(1)`, as each connect succeeds);
// the `command` role's 1 s bound covers the resends too (ioredis times a command once).
const RESEND_AFTER_RECONNECT = 2;
const onReadonly = (err: Error) =>
  err.message.startsWith('READONLY') ? RESEND_AFTER_RECONNECT : false;

/**
 * The Cluster of the `command` role, with two fixes for what Sluice needs of it:
 * - every command gives up after COMMAND_TIMEOUT_MS in all, as on one node: ioredis applies
 *   `commandTimeout` only once a node takes the command, and while the cluster itself
 *   reconnects, commands wait in its own queue without a bound;
 * - every PUBLISH goes through one node (the owner of PUBLISH_SLOT). A PUBLISH has no key, so
 *   ioredis sends each one, and each keyless pipeline, to a random node, and the cluster bus
 *   delivers messages from different nodes in no common order: reply frames would overtake
 *   each other (the gateway reads that as a lost frame). From one node they arrive in order.
 */
const PUBLISH_SLOT = 0;

class SluiceCluster extends Cluster {
  override sendCommand(
    command: Command,
    stream?: never,
    node?: { slot?: number; redis?: unknown },
  ): unknown {
    command.setTimeout(COMMAND_TIMEOUT_MS);
    if (command.name === 'publish') {
      // A pipeline passes its node before the first command picks the connection: steer it.
      if (node === undefined) node = { slot: PUBLISH_SLOT };
      else if (node.redis === undefined) node.slot = PUBLISH_SLOT;
    }
    return super.sendCommand(command, stream, node);
  }
}

function tlsOptions(topology: RedisTopology) {
  return topology.tlsCaFile === undefined ? undefined : { ca: readCa(topology.tlsCaFile) };
}

function credentials(topology: RedisTopology): RedisOptions {
  return {
    ...(topology.username === undefined ? {} : { username: topology.username }),
    ...(topology.password === undefined ? {} : { password: topology.password }),
  };
}

/** How often a Cluster connection reads the slot map (CLUSTER SLOTS) on its own. */
const SLOTS_REFRESH_MS = 1000;

function createCluster(
  topology: Extract<RedisTopology, { kind: 'cluster' }>,
  name: string,
  role: RedisRole,
): Cluster {
  const tls = tlsOptions(topology);
  const options: ClusterOptions = {
    clusterRetryStrategy: backoff,
    enableReadyCheck: true,
    // ioredis reads the slot map again only on MOVED, ASK or CLUSTERDOWN, or when a node's
    // connection closes. A master that hangs (stopped, partitioned) does neither: after its
    // replica is promoted, every command for its slots kept going to it and timed out, for good
    // (a pool's lease among them: no leader again). Read every second instead.
    slotsRefreshInterval: SLOTS_REFRESH_MS,
    // A Cluster pipelines by itself: the option of its node connections is not read.
    ...(role === 'command' ? clusterPipelinePerTurn : {}),
    // BullMQ reads maxRetriesPerRequest from here (it must be null on its connections), and
    // each node connection takes these options; nodes never reconnect on their own, the
    // cluster does (clusterRetryStrategy).
    redisOptions: {
      connectionName: name,
      ...credentials(topology),
      ...(tls ? { tls } : {}),
      ...roleOptions[role],
    },
  };
  const nodes = topology.nodes.map(({ host, port }) => ({ host, port }));
  return role === 'command' ? new SluiceCluster(nodes, options) : new Cluster(nodes, options);
}

const list = (nodes: ReadonlyArray<{ host: string; port: number }>) =>
  nodes
    .map(({ host, port }) => (host.includes(':') ? `[${host}]:${port}` : `${host}:${port}`))
    .join(',');

// Where each connection points, for messages; a Cluster keeps its seed nodes private.
const addresses = new WeakMap<Redis, string>();

/** Where a connection points: `host:port`, `master <name> via sentinels ...` or `cluster <seeds>`. */
export function redisAddress(redis: Redis): string {
  const known = addresses.get(redis);
  if (known !== undefined) return known;
  const { host, port } = redis.options as RedisOptions;
  return `${host}:${port}`;
}

/** A connection for `role` to the Redis of `topology` (a plain URL means one node). */
export function createRedis(url: string, options: RedisConnectOptions): NodeRedis;
export function createRedis(topology: RedisTopology, options: RedisConnectOptions): Redis;
export function createRedis(
  topology: RedisTopology | string,
  { name, role }: RedisConnectOptions,
): Redis {
  if (typeof topology === 'string') topology = { kind: 'single', url: topology };
  if (topology.kind === 'cluster') {
    const cluster = createCluster(topology, name, role);
    addresses.set(cluster, `cluster ${list(topology.nodes)}`);
    return cluster;
  }
  const common: RedisOptions = {
    connectionName: name,
    retryStrategy: backoff,
    reconnectOnError: onReadonly,
    ...credentials(topology),
    ...roleOptions[role],
  };
  const tls = tlsOptions(topology);
  const finish = (redis: NodeRedis) => comesBack(role === 'bullmq' ? corkPerTurn(redis) : redis);
  if (topology.kind === 'single')
    return finish(new NodeRedis(topology.url, { ...common, ...(tls ? { tls } : {}) }));
  const redis = new NodeRedis({
    ...common,
    sentinels: topology.sentinels.map(({ host, port }) => ({ host, port })),
    name: topology.masterName,
    ...(topology.sentinelPassword === undefined
      ? {}
      : { sentinelPassword: topology.sentinelPassword }),
    ...(tls ? { tls, sentinelTLS: tls, enableTLSForSentinelMode: true } : {}),
    // Follow a failover the moment the sentinels announce it (+switch-master), even while the
    // old master still answers; READONLY (common) covers a demoted master we are still on.
    failoverDetector: true,
  });
  addresses.set(redis, `master ${topology.masterName} via sentinels ${list(topology.sentinels)}`);
  return finish(redis);
}
