// A whole local deployment for a test: redis-server, the engine simulator serving model `m`,
// and Sluice's dispatchers and gateways on it. The set-up most end-to-end tests share.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { keySpace } from '@sluice/protocol';
import { Redis } from 'ioredis';
import { eventually, startEngineSim, type TestEngineSim } from './engine-sim.ts';
import { startRedis, type TestRedis } from './redis.ts';
import { startDispatcher, startGateway, type SluiceProcess } from './sluice.ts';

export interface StackOptions {
  /** engine-sim flags after `--profile instant --model m`. */
  sim?: string[];
  /**
   * The text of a SLUICE_CONFIG file (YAML), made once the simulator runs, from it (its `url`
   * for the engines). The stack writes it to a directory of its own, gives every Sluice
   * process SLUICE_CONFIG and no VLLM_URL or VLLM_MODEL (the file lists the engines, and the
   * configuration refuses VLLM_URL beside it), and removes the directory in `stop()`, once
   * everything it started has stopped.
   */
  config?: (sim: TestEngineSim) => string;
  /**
   * Environment of every Sluice process, over REDIS_URL and VLLM_URL and VLLM_MODEL (or
   * SLUICE_CONFIG, with `config`).
   */
  env?: Record<string, string>;
  /**
   * Dispatchers to start, one after the other (default 1). Nothing waits for one of them to
   * lead: the first usually does, but a test that needs to know which leads asks them, or
   * names them with `dispatcherIds`.
   */
  dispatchers?: number;
  /**
   * A leader and its standbys, instead of `dispatchers`: a dispatcher for each
   * SLUICE_DISPATCHER_ID, in this order, the next one started only once the first holds the
   * default pool's lease (`leasePool`'s). The first leads; the others stand by.
   */
  dispatcherIds?: string[];
  /**
   * With `dispatcherIds`: the pool whose lease the first must hold before the next starts
   * (default `default`, the VLLM_URL pool; a `config` file names its own pools).
   */
  leasePool?: string;
  /** Gateway replicas to start (default 1). */
  gateways?: number;
  /**
   * false: the gateways' output after their ready lines is drained, not kept (default true).
   * For benchmarks, so that the load generator does not also read an access log line per request.
   */
  keepGatewayOutput?: boolean;
}

export interface Stack {
  redis: TestRedis;
  sim: TestEngineSim;
  /**
   * The environment the Sluice processes got: for more of them, started by the test (and
   * stopped before `stop()`, which removes a `config` file).
   */
  env: Record<string, string>;
  dispatchers: SluiceProcess[];
  gateways: SluiceProcess[];
  /** The first dispatcher and gateway; reading one that was not started throws. */
  dispatcher: SluiceProcess;
  gateway: SluiceProcess;
  /**
   * Stops gateways, dispatchers, the simulator and Redis, in that order, then removes the
   * `config` file's directory.
   */
  stop(): Promise<void>;
}

/**
 * Resolves once dispatcher `id` holds `pool`'s lease in the Redis at `redisUrl` (key space
 * `prefix`, SLUICE_REDIS_PREFIX's default unless given).
 */
export async function untilLeads(
  redisUrl: string,
  id: string,
  { pool = 'default', prefix }: { pool?: string; prefix?: string } = {},
): Promise<void> {
  const client = new Redis(redisUrl);
  try {
    const lease = keySpace(prefix).lease(pool);
    await eventually(
      async () => (await client.get(lease)) === id,
      `dispatcher ${id} to hold the ${pool} pool's lease`,
    );
  } finally {
    await client.quit();
  }
}

export async function startStack(options: StackOptions = {}): Promise<Stack> {
  if (options.dispatchers !== undefined && options.dispatcherIds !== undefined)
    throw new Error('startStack: give dispatchers or dispatcherIds, not both');
  if (options.leasePool !== undefined && options.dispatcherIds === undefined)
    throw new Error('startStack: leasePool is for dispatcherIds');
  const started: { stop(): Promise<void> }[] = [];
  const stop = async () => {
    for (const p of started.splice(0).reverse()) await p.stop();
  };
  try {
    const redis = await startRedis();
    started.push(redis);
    const sim = await startEngineSim([
      '--profile',
      'instant',
      '--model',
      'm',
      ...(options.sim ?? []),
    ]);
    started.push(sim);
    let engines: Record<string, string> = { VLLM_URL: sim.url, VLLM_MODEL: 'm' };
    if (options.config) {
      const dir = mkdtempSync(join(tmpdir(), 'sluice-stack-'));
      // First in the list: stop() removes it last, after every process that may read it.
      started.unshift({ stop: async () => rmSync(dir, { recursive: true, force: true }) });
      const file = join(dir, 'sluice.yaml');
      writeFileSync(file, options.config(sim));
      engines = { SLUICE_CONFIG: file };
    }
    const env: Record<string, string> = { REDIS_URL: redis.url, ...engines, ...options.env };
    const ids: (string | undefined)[] =
      options.dispatcherIds ?? Array.from({ length: options.dispatchers ?? 1 }, () => undefined);
    const dispatchers: SluiceProcess[] = [];
    for (const [i, id] of ids.entries()) {
      const dispatcher = await startDispatcher(
        id === undefined ? env : { ...env, SLUICE_DISPATCHER_ID: id },
      );
      dispatchers.push(dispatcher);
      started.push(dispatcher);
      if (i === 0 && id !== undefined)
        await untilLeads(redis.url, id, {
          pool: options.leasePool,
          prefix: env['SLUICE_REDIS_PREFIX'],
        });
    }
    const gateways = await Promise.all(
      Array.from({ length: options.gateways ?? 1 }, () =>
        startGateway(env, { keepOutput: options.keepGatewayOutput }),
      ),
    );
    started.push(...gateways);
    const first = (list: SluiceProcess[], what: string) => {
      if (list.length === 0) throw new Error(`startStack: no ${what} was started`);
      return list[0]!;
    };
    return {
      redis,
      sim,
      env,
      dispatchers,
      gateways,
      get dispatcher() {
        return first(dispatchers, 'dispatcher');
      },
      get gateway() {
        return first(gateways, 'gateway');
      },
      stop,
    };
  } catch (err) {
    await stop();
    throw err;
  }
}
