// Long prompts the leader holds back (in BullMQ's delayed set, while another long prompt
// prefills) survive a SIGKILL of that leader: the standby adopts them and releases them in
// turn; the one that was in flight ends with an explicit error; nothing runs twice.
import { keySpace } from '@sluice/protocol';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { eventually, queuedJobs, startStack, type Stack } from '../support/index.ts';

let stack: Stack;

beforeAll(async () => {
  stack = await startStack({
    // A 9,000-token prompt takes 4.5 s to prefill: long enough to be held behind.
    sim: ['--prefill-tokens-per-second', '2000'],
    env: {
      ADMISSION_MAX_INFLIGHT: '4',
      SLUICE_LEASE_TTL_MS: '1000',
      SLUICE_RELAY_LIVENESS_MS: '200',
      SLUICE_RELAY_SILENCE_TIMEOUT_MS: '1000',
      ENGINE_SCRAPE_INTERVAL_MS: '100',
    },
    dispatcherIds: ['first', 'second'],
  });
});

afterAll(() => stack?.stop());

/** A streaming request whose prompt the gateway estimates at 9,000 tokens: a long one. */
function longPrompt(tag: string) {
  return fetch(`${stack.gateway.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({
      model: 'm',
      messages: [{ role: 'user', content: `${tag} ${'abcd'.repeat(9000)}`.slice(0, 36_000) }],
      max_tokens: 4,
      stream: true,
    }),
  });
}

async function metric(url: string, line: RegExp): Promise<boolean> {
  return line.test(await (await fetch(`${url}/metrics`)).text());
}

describe('held long prompts across a leader failover', () => {
  it('the standby adopts the long prompts the dead leader held, and each reaches the engine exactly once', async () => {
    const first = longPrompt('first');
    await eventually(
      async () => ((await stack.sim.state()).running === 1 ? true : undefined),
      'the first long prompt on the engine',
    );
    const held = ['second', 'third'].map((tag) =>
      longPrompt(tag).then(async (r) => ({ status: r.status, body: await r.text() })),
    );
    await eventually(
      () =>
        metric(stack.dispatchers[0]!.url, /^sluice_long_prompts_held\{pool="default"\} 2$/m).then(
          (ok) => ok || undefined,
        ),
      'the leader to hold the two long prompts back',
    );
    const client = new Redis(stack.redis.url);
    expect(await queuedJobs(client)).toBe(2); // in the delayed set, counted as queued

    await stack.dispatchers[0]!.stop('SIGKILL');

    // The stream in flight ends with an explicit error; the held ones are served by the standby.
    const reader = (await first).body!.getReader();
    let text = '';
    const decoder = new TextDecoder();
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      text += decoder.decode(value, { stream: true });
    }
    expect(text).toMatch(/"code":"(dispatcher_lost|engine_error)"/);
    for (const answer of await Promise.all(held)) {
      expect(answer.status).toBe(200);
      expect(answer.body.endsWith('data: [DONE]\n\n')).toBe(true);
    }
    expect(await client.get(keySpace().lease('default'))).toBe('second');
    expect(await queuedJobs(client)).toBe(0);
    await client.quit();

    const received = (await (await fetch(`${stack.sim.url}/sim/received`)).json()) as {
      ids: string[];
    };
    expect(received.ids).toHaveLength(3);
    expect(new Set(received.ids).size).toBe(3);
    // The standby, too, prefilled one long prompt at a time: they reached the engine in turn.
    expect((await stack.sim.state()).peakRunning).toBeLessThanOrEqual(2);
  });
});
