// Clients that cannot be served any more: a reader too slow to keep up, and a gateway
// replica that died with requests still queued.
import { connect } from 'node:net';
import { keySpace } from '@sluice/protocol';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  eventually,
  queuedJobs,
  startGateway,
  startStack,
  type SluiceProcess,
  type Stack,
  type TestEngineSim,
  untilReady,
} from '../support/index.ts';

// The answer must be far larger than what the kernel buffers for a loopback connection that
// nobody reads (tcp_rmem's maximum alone is 32 MiB on some hosts): 600,000 tokens make
// about 120 MB of SSE, so the gateway's own socket must back up whatever the host's limits.
const FLOOD_TOKENS = 600_000;

let stack: Stack;
let sim: TestEngineSim;
let dispatcher: SluiceProcess;
let env: Record<string, string>;
let client: Redis;

beforeAll(async () => {
  // No gateway yet: each test starts the replicas it needs.
  stack = await startStack({
    sim: ['--max-num-seqs', '64', '--max-model-len', String(FLOOD_TOKENS + 1000)],
    env: { ADMISSION_MAX_INFLIGHT: '2', SLUICE_REPLICA_TTL_MS: '500' },
    gateways: 0,
  });
  ({ sim, dispatcher, env } = stack);
  client = new Redis(stack.redis.url);
});

afterAll(async () => {
  await client?.quit();
  await stack?.stop();
});

const metric = async (url: string, name: string, reason: string) => {
  const text = await (await fetch(`${url}/metrics`)).text();
  const line = text
    .split('\n')
    .find((l) => l.startsWith(`${name}{`) && l.includes(`reason="${reason}"`));
  return line ? Number(line.split(' ').pop()) : 0;
};

function chat(
  base: string,
  content: string,
  extra: Record<string, unknown> = {},
  signal?: AbortSignal,
) {
  return fetch(`${base}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'm', messages: [{ role: 'user', content }], ...extra }),
    signal,
  });
}

describe('clients that are gone', () => {
  it('cancels a stream whose client stops reading once SLUICE_SLOW_CLIENT_BYTES are buffered, and frees the engine', async () => {
    // Its liveness key lives the default 5 s, not the 500 ms the dead-replica test below
    // needs: on a loaded machine a gateway can miss a 500 ms beat, and the dispatcher would
    // then skip or cancel its job as a dead replica's.
    const gateway = await startGateway({
      ...env,
      SLUICE_SLOW_CLIENT_BYTES: '1024',
      SLUICE_REPLICA_TTL_MS: '5000',
    });
    try {
      // A request before the dispatcher holds the lease would be refused no_leader.
      await untilReady(gateway);
      const { port } = new URL(gateway.url);
      const body = JSON.stringify({
        model: 'm',
        messages: [{ role: 'user', content: 'flood' }],
        max_tokens: FLOOD_TOKENS,
        ignore_eos: true,
        stream: true,
      });
      const socket = connect(Number(port), '127.0.0.1');
      await new Promise<void>((resolve) => socket.once('connect', () => resolve()));
      socket.write(
        `POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\n\r\n${body}`,
      );
      socket.pause(); // never read: the kernel buffers fill, then the gateway's
      await eventually(
        async () =>
          (await metric(gateway.url, 'sluice_rejected_total', 'slow_client')) === 1
            ? true
            : undefined,
        'the slow client to be cut off',
        // The simulator must first fill the kernel's buffers (tens of MB): slow on a busy host.
        300_000,
      ).catch(async (err: Error) => {
        // What happened instead (a refusal is in the gateway's access log) says why.
        const said = [gateway, dispatcher].flatMap((p) => p.process.output.slice(-10));
        const engine = JSON.stringify(await sim.state());
        throw new Error(
          `${err.message}; the engine: ${engine}; the gateway and dispatcher said:\n${said.join('\n')}`,
        );
      });
      await eventually(
        async () => ((await sim.state()).running === 0 ? true : undefined),
        'the engine to drop the sequence',
      );
      socket.destroy();
    } finally {
      await gateway.stop();
    }
  }, 420_000);

  it('drops jobs whose gateway replica died instead of running them for nobody', async () => {
    const [doomed, survivor] = await Promise.all([startGateway(env), startGateway(env)]);
    try {
      const before = (await sim.state()).receivedTotal as number;
      // Two endless streams through the surviving replica hold both slots.
      const controller = new AbortController();
      const blockers = await Promise.all(
        [0, 1].map((i) =>
          chat(
            survivor.url,
            `blocker ${i}`,
            { stream: true, max_tokens: 130_000, ignore_eos: true },
            controller.signal,
          ),
        ),
      );
      // Read to the end (the abort below): a client that stopped reading would be cut as slow
      // once its unread bytes pass SLUICE_SLOW_CLIENT_BYTES, freeing the slots before the
      // orphans are skipped (seen on a loaded CI machine: both blockers 499 slow_client).
      const readers = blockers.map((r) => r.body!.getReader());
      await Promise.all(readers.map((reader) => reader.read()));
      const drained = readers.map(async (reader) => {
        try {
          while (!(await reader.read()).done);
        } catch {
          // Aborted by the test.
        }
      });
      // Two requests wait in the queue on the replica that is about to die.
      const orphans = [0, 1].map((i) => chat(doomed.url, `orphan ${i}`).catch(() => undefined));
      const queued = async () => await queuedJobs(client);
      await eventually(
        async () => ((await queued()) === 2 ? true : undefined),
        'two queued orphans',
      );
      await doomed.stop('SIGKILL');
      await Promise.all(orphans);
      await eventually(
        async () =>
          (await client.exists(
            keySpace().replicaAlive(
              doomed.process.ready.input?.match(/"replica":"([^"]+)"/)?.[1] ?? '',
            ),
          )) === 0
            ? true
            : undefined,
        'the dead replica liveness key to expire',
      );
      controller.abort();
      await Promise.all(drained);
      await eventually(
        async () => ((await queued()) === 0 ? true : undefined),
        'the orphans to be taken and dropped',
      );
      await eventually(
        async () =>
          (await metric(dispatcher.url, 'sluice_skipped_total', 'client_gone')) === 2
            ? true
            : undefined,
        'two jobs skipped as client_gone',
      );
      expect((await sim.state()).receivedTotal).toBe(before + 2); // the blockers only
    } finally {
      await Promise.all([doomed.stop(), survivor.stop()]);
    }
  });
});
