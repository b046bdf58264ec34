export {
  COMMAND_TIMEOUT_MS,
  createRedis,
  isAuthError,
  RedisAuthError,
  redisHealthy,
  redisReady,
  type RedisConnectOptions,
  type RedisRole,
} from './connect.js';
export type { Redis } from 'ioredis';
