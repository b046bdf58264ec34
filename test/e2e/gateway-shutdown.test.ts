// A gateway replica stopped with SIGTERM (a rolling update): it leaves the load balancer at
// once, refuses new requests, serves the streams it holds to their end and exits by itself
// as soon as nothing is held. What the drain period cannot finish is answered explicitly:
// a queued client gets 503 shutting_down and its job never reaches an engine; a stream is
// cut with an in-band error and its engine request is cancelled.
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  eventually,
  metricSum,
  queuedJobs,
  readAll,
  type Stack,
  startGateway,
  startStack,
} from '../support/index.ts';

let stack: Stack;
let client: Redis;

beforeAll(async () => {
  // Every scheduler step takes 0.1 s whatever the batch: an 80-token answer streams for 8 s.
  stack = await startStack({
    sim: ['--max-num-seqs', '64', '--step-overhead-seconds', '0.1'],
    env: { ADMISSION_MAX_INFLIGHT: '2', SLUICE_DEGRADATION: 'off' },
    gateways: 0,
  });
  client = new Redis(stack.redis.url);
});

afterAll(async () => {
  await client?.quit();
  await stack?.stop();
});

function chatBody(tag: string, extra: Record<string, unknown>) {
  return JSON.stringify({
    model: 'm',
    messages: [
      { role: 'system', content: tag },
      { role: 'user', content: `tell me about ${tag}` },
    ],
    ...extra,
  });
}

function chat(base: string, tag: string, extra: Record<string, unknown> = {}) {
  return fetch(`${base}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: chatBody(tag, extra),
  });
}

/** The content deltas of an SSE chat stream, joined. */
function streamedContent(sse: string): string {
  return sse
    .split('\n')
    .filter((line) => line.startsWith('data: {'))
    .map((line) => JSON.parse(line.slice(6)) as { choices?: { delta?: { content?: string } }[] })
    .map((chunk) => chunk.choices?.[0]?.delta?.content ?? '')
    .join('');
}

describe('gateway SIGTERM', () => {
  it('serves two held 8-second streams to their end, refuses new requests meanwhile, and exits by itself after them', async () => {
    // A drain period far past the test's time-out: the process must exit because nothing is
    // held any more, not because the period ended.
    const gateway = await startGateway({ ...stack.env, SLUICE_SHUTDOWN_DRAIN_SECONDS: '600' });
    const exited = new Promise<number>((resolve) =>
      gateway.process.child.once('exit', () => resolve(Date.now())),
    );
    try {
      const extra = { stream: true, max_tokens: 80, ignore_eos: true };
      const streams = await Promise.all(
        ['first', 'second'].map((tag) => chat(gateway.url, tag, extra)),
      );
      for (const s of streams) expect(s.status).toBe(200);
      const readers = streams.map((s) => readAll(s));
      // A stream's head comes from the engine: both run there now.
      expect(await metricSum(gateway.url, 'sluice_held_requests')).toBe(2);
      expect(await metricSum(gateway.url, 'sluice_parked_requests')).toBe(0);
      // What the engine answers to the same requests without Sluice in between, asked only
      // now: the gate counts the engine's own running requests, so direct requests sent
      // earlier could hold a slot and let one stream start after the other had ended.
      const direct = ['first', 'second'].map((tag) =>
        fetch(`${stack.sim.url}/v1/chat/completions`, {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: chatBody(tag, { ...extra, stream: false }),
        }).then(
          async (r) =>
            ((await r.json()) as { choices: { message: { content: string } }[] }).choices[0]!
              .message.content,
        ),
      );

      gateway.process.child.kill('SIGTERM');
      await gateway.process.waitForLine(/"msg":"gateway draining"/);

      // Out of the load balancer, and new requests are refused with a retryable 503.
      const ready = await fetch(`${gateway.url}/readyz`);
      expect(ready.status).toBe(503);
      // Kubernetes' probe (only this replica's own state) says so too.
      const own = await fetch(`${gateway.url}/readyz?scope=replica`);
      expect({ status: own.status, body: await own.json() }).toEqual({
        status: 503,
        body: { draining: true },
      });
      const refused = await chat(gateway.url, 'late', { max_tokens: 4 });
      expect(refused.status).toBe(503);
      expect(refused.headers.get('x-sluice-reject-reason')).toBe('shutting_down');
      expect(Number(refused.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);
      expect(((await refused.json()) as { error: { code: string } }).error.code).toBe(
        'shutting_down',
      );

      const texts = await Promise.all(readers);
      const streamsEndedAt = Date.now();
      const answers = await Promise.all(direct);
      texts.forEach((text, i) => {
        expect(text.endsWith('data: [DONE]\n\n')).toBe(true);
        expect(text).not.toContain('"error"');
        expect(streamedContent(text)).toBe(answers[i]);
      });
      // Both streams whole means the exit did not come before them; it comes by itself.
      const exitedAt = await exited;
      expect(gateway.process.child.exitCode).toBe(0);
      // For the operator's figures; speed is not asserted here.
      console.info(
        `gateway SIGTERM: exited ${exitedAt - streamsEndedAt} ms after both streams ended`,
      );
      expect(gateway.process.output.join('\n')).not.toContain('drain period over');
    } finally {
      await gateway.stop('SIGKILL');
    }
  });

  it('with a short drain period, answers a queued client 503 shutting_down (its job never reaches the engine) and cuts the streams in-band, freeing their engine slots', async () => {
    const gateway = await startGateway({ ...stack.env, SLUICE_SHUTDOWN_DRAIN_SECONDS: '1' });
    try {
      await eventually(
        async () => ((await stack.sim.state()).running === 0 ? true : undefined),
        'an idle engine',
      );
      const extra = { stream: true, max_tokens: 100_000, ignore_eos: true };
      // Two endless streams take both slots of the cap...
      const blockers = await Promise.all(
        ['blocker a', 'blocker b'].map((tag) => chat(gateway.url, tag, extra)),
      );
      const endings = blockers.map((b) => readAll(b));
      await eventually(
        async () => ((await stack.sim.state()).running === 2 ? true : undefined),
        'both blockers on the engine',
      );
      // ...so this one waits in the queue.
      const queued = chat(gateway.url, 'queued-at-shutdown', { max_tokens: 4 });
      await eventually(
        async () => ((await queuedJobs(client)) === 1 ? true : undefined),
        'one queued job',
      );

      await gateway.stop('SIGTERM');

      const answer = await queued;
      expect(answer.status).toBe(503);
      expect(answer.headers.get('x-sluice-reject-reason')).toBe('shutting_down');
      expect(Number(answer.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);
      for (const text of await Promise.all(endings))
        expect(text).toMatch(
          /data: \{"error":\{"message":"[^"]+","type":"server_error","param":null,"code":"shutting_down"\}\}\n\ndata: \[DONE\]\n\n$/,
        );
      // The queued job left the queue, and the streams' engine requests were cancelled.
      expect(await queuedJobs(client)).toBe(0);
      await eventually(
        async () => ((await stack.sim.state()).running === 0 ? true : undefined),
        'the engine to drop both cut streams',
      );
      const received = (await (await fetch(`${stack.sim.url}/sim/received`)).json()) as {
        requests: { system: string | null }[];
      };
      expect(received.requests.map((r) => r.system)).toContain('blocker a');
      expect(received.requests.map((r) => r.system)).not.toContain('queued-at-shutdown');
    } finally {
      await gateway.stop('SIGKILL');
    }
  });
});
