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
export { startDispatcher, startGateway, type SluiceProcess } from './sluice.ts';
export { queuedJobs } from './queue.ts';
export { startStack, type Stack, type StackOptions } from './stack.ts';
export { alive, answer, chat, metricSum, readAll, type Answer } from './client.ts';
