// A whole local deployment for a test: redis-server, the engine simulator serving model `m`,
// and Sluice's dispatchers and gateways on it. The set-up most end-to-end tests share.
import { startEngineSim, type TestEngineSim } from './engine-sim.ts';
import { startRedis, type TestRedis } from './redis.ts';
import { startDispatcher, startGateway, type SluiceProcess } from './sluice.ts';

export interface StackOptions {
  /** engine-sim flags after `--profile instant --model m`. */
  sim?: string[];
  /** Environment of every Sluice process, over REDIS_URL, VLLM_URL and VLLM_MODEL. */
  env?: Record<string, string>;
  /** Dispatchers to start, one after the other: the first one leads (default 1). */
  dispatchers?: number;
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
  /** The environment the Sluice processes got: for more of them, started by the test. */
  env: Record<string, string>;
  dispatchers: SluiceProcess[];
  gateways: SluiceProcess[];
  /** The first dispatcher and gateway; reading one that was not started throws. */
  dispatcher: SluiceProcess;
  gateway: SluiceProcess;
  /** Stops gateways, dispatchers, the simulator and Redis, in that order. */
  stop(): Promise<void>;
}

export async function startStack(options: StackOptions = {}): Promise<Stack> {
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
    const env = { REDIS_URL: redis.url, VLLM_URL: sim.url, VLLM_MODEL: 'm', ...options.env };
    const dispatchers: SluiceProcess[] = [];
    for (let i = 0; i < (options.dispatchers ?? 1); i += 1) {
      dispatchers.push(await startDispatcher(env));
      started.push(dispatchers.at(-1)!);
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
