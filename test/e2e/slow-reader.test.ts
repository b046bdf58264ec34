// A streaming client that stops reading. The byte bound alone lets it hold an engine slot for
// as long as the engine takes to fill that many bytes (minutes at real decode speed); the
// stall limit cuts it once its socket has not drained for SLUICE_SLOW_CLIENT_STALL_SECONDS.
import { connect } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { eventually, startGateway, startStack, untilReady, type Stack } from '../support/index.ts';

// The answer must be far larger than what the kernel buffers for a loopback connection that
// nobody reads (tcp_rmem's maximum alone is 32 MiB on some hosts): 600,000 tokens make
// about 120 MB of SSE, so the gateway's own socket must back up whatever the host's limits.
const FLOOD_TOKENS = 600_000;

let stack: Stack;

beforeAll(async () => {
  stack = await startStack({
    sim: ['--max-num-seqs', '64', '--max-model-len', String(FLOOD_TOKENS + 1000)],
    gateways: 0,
  });
});

afterAll(async () => {
  await stack?.stop();
});

async function rejected(url: string, reason: string): Promise<number> {
  const text = await (await fetch(`${url}/metrics`)).text();
  const line = text
    .split('\n')
    .find((l) => l.startsWith('sluice_rejected_total{') && l.includes(`reason="${reason}"`));
  return line ? Number(line.split(' ').pop()) : 0;
}

describe('slow reader', () => {
  it('cancels the engine request of a stream whose socket has not drained for the stall limit, far below the byte bound', async () => {
    // 1 GiB is more than this answer can ever be: only the stall limit can cut it.
    const gateway = await startGateway({
      ...stack.env,
      SLUICE_SLOW_CLIENT_BYTES: String(1024 ** 3),
      SLUICE_SLOW_CLIENT_STALL_SECONDS: '1',
    });
    // A request before the dispatcher holds the lease would be refused no_leader.
    await untilReady(gateway);
    const socket = connect(Number(new URL(gateway.url).port), '127.0.0.1');
    try {
      const body = JSON.stringify({
        model: 'm',
        messages: [{ role: 'user', content: 'flood' }],
        max_tokens: FLOOD_TOKENS,
        ignore_eos: true,
        stream: true,
      });
      await new Promise<void>((resolve) => socket.once('connect', () => resolve()));
      socket.write(
        `POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\n\r\n${body}`,
      );
      socket.pause(); // never read: the kernel buffers fill, then the gateway's socket stalls
      await eventually(
        async () => ((await stack.sim.state()).running === 1 ? true : undefined),
        'the stream on the engine',
      ).catch(async (err: Error) => {
        // Whatever answered instead (a refusal is in the gateway's access log) says why.
        const said = [gateway, stack.dispatcher].flatMap((p) => p.process.output.slice(-10));
        const engine = JSON.stringify(await stack.sim.state());
        throw new Error(
          `${err.message}; the engine: ${engine}; the gateway and dispatcher said:\n${said.join('\n')}`,
        );
      });
      await eventually(
        async () => ((await rejected(gateway.url, 'slow_client')) === 1 ? true : undefined),
        'the stalled client to be cut off',
        // The simulator must first fill the kernel's buffers (tens of MB): slow on a busy host.
        300_000,
      );
      await eventually(
        async () => ((await stack.sim.state()).running === 0 ? true : undefined),
        'the engine to drop the sequence',
      );
      // Cut once, by the stall limit: the byte bound is out of reach.
      expect(await rejected(gateway.url, 'slow_client')).toBe(1);
    } finally {
      socket.destroy();
      await gateway.stop();
    }
  }, 420_000);
});
