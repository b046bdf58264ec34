// Killing the leading dispatcher with SIGKILL: the standby takes over, clients of the
// requests that were in flight hear about it, nothing runs twice and the cap holds.
import { keySpace } from '@sluice/protocol';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { eventually, queuedJobs, startStack, type Stack } from '../support/index.ts';

let stack: Stack;

beforeAll(async () => {
  stack = await startStack({
    sim: ['--max-num-seqs', '64', '--decode-seconds-per-sequence', '0.01'],
    env: {
      ADMISSION_MAX_INFLIGHT: '2',
      VLLM_MAX_QUEUE_DEPTH: '100',
      SLUICE_LEASE_TTL_MS: '1000',
      SLUICE_RELAY_LIVENESS_MS: '200',
      SLUICE_RELAY_SILENCE_TIMEOUT_MS: '1000',
    },
    // The first one leads before the standby starts.
    dispatcherIds: ['first', 'second'],
  });
});

afterAll(() => stack?.stop());

function chat(content: string, extra: Record<string, unknown> = {}) {
  return fetch(`${stack.gateway.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'm', messages: [{ role: 'user', content }], ...extra }),
  });
}

/** The rest of a stream as text; a transport failure is returned as text too, to be asserted on. */
async function readToEnd(reader: ReadableStreamDefaultReader<Uint8Array>): Promise<string> {
  const decoder = new TextDecoder();
  let text = '';
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) return text;
      text += decoder.decode(value, { stream: true });
    }
  } catch (err) {
    return `${text}\ntransport error: ${String(err)}`;
  }
}

describe('leader failover', () => {
  it('after SIGKILL of the leader, the standby releases the queued jobs; in-flight clients get an explicit error; nothing runs twice; the cap holds', async () => {
    await fetch(`${stack.sim.url}/sim/peak/reset`, { method: 'POST' });
    // Two long streams occupy the cap on the first dispatcher...
    const inflight = await Promise.all(
      [0, 1].map((i) => chat(`long ${i}`, { stream: true, max_tokens: 100000, ignore_eos: true })),
    );
    const readers = inflight.map((r) => r.body!.getReader());
    await Promise.all(readers.map((reader) => reader.read()));
    // ...and three short requests wait in the queue behind them.
    const queuedAnswers = [0, 1, 2].map((i) =>
      chat(`queued ${i}`, { max_tokens: 4 }).then(async (r) => ({
        status: r.status,
        body: await r.text(),
      })),
    );
    const client = new Redis(stack.redis.url);
    await eventually(
      async () => ((await queuedJobs(client)) === 3 ? true : undefined),
      'three queued jobs',
    );

    await stack.dispatchers[0]!.stop('SIGKILL');

    // The in-flight streams end with an explicit in-band error, not a silent truncation.
    const endings = await Promise.all(readers.map((reader) => readToEnd(reader)));
    for (const text of endings)
      expect(text).toMatch(
        /data: \{"error":\{"message":"[^"]+","type":"server_error","param":null,"code":"(dispatcher_lost|engine_error)"\}\}\n\ndata: \[DONE\]\n\n$/,
      );

    // The standby takes the lease and releases the queued jobs.
    const answers = await Promise.all(queuedAnswers);
    for (const a of answers) expect(a.status).toBe(200);
    expect(await client.get(keySpace().lease('default'))).toBe('second');
    await client.quit();

    // Every request reached the engine exactly once, and never more than 2 at a time.
    const received = (await (await fetch(`${stack.sim.url}/sim/received`)).json()) as {
      ids: string[];
    };
    expect(new Set(received.ids).size).toBe(received.ids.length);
    expect(received.ids).toHaveLength(5);
    expect((await stack.sim.state()).peakRequests).toBeLessThanOrEqual(2);
  });
});
