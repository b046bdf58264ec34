// What `sluice status` says about the Redis it talks to, and reads that must span a Cluster.
import { maskCredentials, type RedisTopology } from '@sluice/config';
import { Redis as NodeRedis } from 'ioredis';
import { COMMAND_TIMEOUT_MS, isCluster, listNodes as list, type Redis } from './connect.js';
import { readCa } from './tls.js';

/** One line naming the topology, credentials masked: `sentinel mymaster via s1:26379,...`. */
export function describeTopology(topology: RedisTopology): string {
  const tls = topology.tlsCaFile === undefined ? '' : ` (TLS, CA ${topology.tlsCaFile})`;
  switch (topology.kind) {
    case 'single':
      return `single ${maskCredentials(topology.url)}${tls}`;
    case 'sentinel':
      return `sentinel ${topology.masterName} via ${list(topology.sentinels)}${tls}`;
    case 'cluster':
      return `cluster seeds ${list(topology.nodes)}${tls}`;
  }
}

/**
 * The master the sentinels name now (`SENTINEL get-master-addr-by-name`), as `host:port`:
 * the first sentinel that answers wins. Rejects when none does.
 */
export async function sentinelMaster(
  topology: Extract<RedisTopology, { kind: 'sentinel' }>,
): Promise<string> {
  const tls = topology.tlsCaFile === undefined ? undefined : { ca: readCa(topology.tlsCaFile) };
  const failures: string[] = [];
  for (const { host, port } of topology.sentinels) {
    const sentinel = new NodeRedis({
      host,
      port,
      ...(topology.sentinelPassword === undefined ? {} : { password: topology.sentinelPassword }),
      ...(tls ? { tls } : {}),
      connectionName: 'sluice:status:sentinel',
      lazyConnect: true,
      retryStrategy: () => null,
      maxRetriesPerRequest: 0,
      connectTimeout: COMMAND_TIMEOUT_MS,
      commandTimeout: COMMAND_TIMEOUT_MS,
    });
    sentinel.on('error', () => {});
    try {
      await sentinel.connect();
      const answer = await sentinel.call(
        'SENTINEL',
        'get-master-addr-by-name',
        topology.masterName,
      );
      if (Array.isArray(answer) && answer.length === 2)
        return list([{ host: String(answer[0]), port: Number(answer[1]) }]);
      failures.push(`${list([{ host, port }])}: no master of that name`);
    } catch (err) {
      failures.push(
        `${list([{ host, port }])}: ${err instanceof Error ? err.message : String(err)}`,
      );
    } finally {
      sentinel.disconnect();
    }
  }
  throw new Error(`no sentinel named the master ${topology.masterName} (${failures.join('; ')})`);
}

/**
 * Every key matching `pattern`, by SCAN (never KEYS: it would block a production Redis).
 * On a Cluster each master holds its own keys, so each is scanned.
 */
export async function scanKeys(redis: Redis, pattern: string): Promise<string[]> {
  const sources = isCluster(redis) ? redis.nodes('master') : [redis];
  const keys = new Set<string>();
  for (const source of sources)
    for await (const batch of source.scanStream({ match: pattern, count: 1000 }))
      for (const key of batch as string[]) keys.add(key);
  return [...keys];
}
