export {
  createRedis,
  redisHealthy,
  redisReady,
  type RedisConnectOptions,
  type RedisRole,
} from './connect.js';
export type { Redis } from 'ioredis';
