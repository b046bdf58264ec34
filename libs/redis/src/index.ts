export {
  bullScript,
  quietWorkerScripts,
  scriptCommand,
  withoutEventsStream,
  type BullScript,
  type QuietOptions,
  type ScriptCommand,
} from './bull-scripts.js';
export {
  COMMAND_TIMEOUT_MS,
  createRedis,
  isCluster,
  redisAddress,
  type Redis,
  type RedisConnectOptions,
  type RedisRole,
} from './connect.js';
export { isAuthError, RedisAuthError, redisHealthy, redisReady } from './health.js';
export { RedisTlsError } from './tls.js';
export { describeTopology, scanKeys, sentinelMaster } from './topology.js';
export { publishingPools, readPoolStats, type PublishedPool } from './pool-stats.js';
export { waitingAfterTake } from './take-count.js';
