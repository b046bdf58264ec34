export { startProcess, type StartedProcess, type StartOptions } from './process.ts';
export { freePort } from './ports.ts';
export { startRedis, type TestRedis, type TestRedisOptions } from './redis.ts';
export {
  startEngineSim,
  eventually,
  repoRoot,
  sluiceBin,
  type TestEngineSim,
} from './engine-sim.ts';
export { startDispatcher, startGateway, untilReady, type SluiceProcess } from './sluice.ts';
export { queuedJobs } from './queue.ts';
export { startStack, untilLeads, type Stack, type StackOptions } from './stack.ts';
export { alive, answer, chat, metricSum, readAll, streamStarted, type Answer } from './client.ts';
export { startSentinel, type TestSentinel, type TestSentinelOptions } from './sentinel.ts';
export {
  startCluster,
  type SlotRange,
  type TestCluster,
  type TestClusterOptions,
} from './cluster.ts';
export {
  makeTestCertificates,
  startTlsRedis,
  type TestCertificates,
  type TestTlsRedis,
} from './tls.ts';
export {
  aclArguments,
  documentedAclRule,
  fallbackAclRule,
  startAclRedis,
  type TestAclRedis,
} from './acl.ts';
export { askNode, type RedisNode } from './redis-node.ts';
export { jsonLines } from './json-lines.ts';
export { tenantPoolYaml, type TenantPoolYaml } from './tenant-config.ts';
export { stoppedAfterEach, type Stoppable } from './cleanup.ts';
export { monitorRedis } from './redis-monitor.ts';
export { startRedisRelay, type RedisRelay } from './relay.ts';
