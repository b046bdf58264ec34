// A gateway process killed and started again under the same SLUICE_REPLICA_ID, as Compose's
// `restart: unless-stopped` and a Kubernetes container restart (the pod keeps its name) do.
// The dead process's clients are gone with it: its running stream and its queued requests must
// be cancelled or skipped, not run in full for nobody while new clients wait behind them.
// Until December 2026 the new process went by the same id, beat the same liveness key and
// subscribed to the same reply channel, so the dispatcher took the dead process's jobs for
// live ones and ran every queued one to its last token.
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  answer,
  chat,
  eventually,
  metricSum,
  queuedJobs,
  startGateway,
  startStack,
  streamStarted,
  untilReady,
  type SluiceProcess,
  type Stack,
} from '../support/index.ts';

let stack: Stack;
let client: Redis;

beforeAll(async () => {
  stack = await startStack({
    // A token every 10 ms: a 400-token answer runs for seconds, long enough to be stopped.
    sim: ['--max-num-seqs', '64', '--decode-seconds-per-sequence', '0.01'],
    env: { ADMISSION_MAX_INFLIGHT: '1' },
    gateways: 0,
  });
  client = new Redis(stack.redis.url);
});

afterAll(async () => {
  await client?.quit();
  await stack?.stop();
});

/** The id the gateway goes by in Redis, as its /healthz says. */
async function replicaOf(gateway: SluiceProcess): Promise<string> {
  const health = (await (await fetch(`${gateway.url}/healthz`)).json()) as { replica: string };
  return health.replica;
}

describe('a gateway restarted under the same SLUICE_REPLICA_ID', () => {
  it("cancels the dead process's running stream and queued requests instead of running them for nobody", async () => {
    const env = { ...stack.env, SLUICE_REPLICA_ID: 'gw-fixed' };
    const doomed = await startGateway(env);
    let restarted: SluiceProcess | undefined;
    try {
      await untilReady(doomed);
      const deadId = await replicaOf(doomed);
      // The one slot runs a long stream; three non-streamed requests queue behind it, each as
      // long: one that is not cancelled never ends, however slow the machine (a shorter one
      // could end before a loaded dispatcher sees its client gone).
      const long = await streamStarted(
        await chat(doomed.url, 'long', { stream: true, max_tokens: 100_000, ignore_eos: true }),
      );
      void long.rest.catch(() => {});
      const orphans = [0, 1, 2].map((i) =>
        chat(doomed.url, `orphan ${i}`, { max_tokens: 100_000, ignore_eos: true }).catch(() => {}),
      );
      await eventually(
        async () => ((await queuedJobs(client)) === 3 ? true : undefined),
        'three queued requests',
      );
      await doomed.stop('SIGKILL');
      await Promise.all(orphans);

      restarted = await startGateway(env);
      await untilReady(restarted);
      // The configured name stays readable; the process is another one.
      const newId = await replicaOf(restarted);
      expect(newId.startsWith('gw-fixed.')).toBe(true);
      expect(newId).not.toBe(deadId);

      // A new client waits behind whatever the dead process left in the queue.
      const fresh = await answer(chat(restarted.url, 'fresh', { max_tokens: 4 }));
      expect(fresh.status).toBe(200);
      // Its job was released after the orphans were taken: each was skipped (its replica
      // dead) or cancelled once on the engine, and so was the stream.
      const dispatcher = stack.dispatcher.url;
      await eventually(
        async () =>
          ((await metricSum(dispatcher, 'sluice_skipped_total', { reason: 'client_gone' })) ?? 0) +
            ((await metricSum(dispatcher, 'sluice_completed_total', { outcome: 'cancelled' })) ??
              0) ===
          4
            ? true
            : undefined,
        'the stream and the three orphans to be skipped or cancelled',
      );
      // Only the new client's answer ran to its end, at the dispatcher and on the engine.
      const ok = await eventually(async () => {
        const n = await metricSum(dispatcher, 'sluice_completed_total', { outcome: 'ok' });
        return n !== undefined && n >= 1 ? n : undefined;
      }, "the new client's job counted");
      expect(ok).toBe(1);
      expect(
        await metricSum(stack.sim.url, 'vllm:request_success_total', { finished_reason: 'length' }),
      ).toBe(1);
    } finally {
      await doomed.stop();
      await restarted?.stop();
    }
  }, 180_000);
});
