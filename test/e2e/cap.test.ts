// The heart of Sluice: three gateway replicas, one dispatcher and a standby, cap 4, in
// front of an engine that would take 64. Every answer must be exactly what the engine
// gives directly, and the engine must never hold more than 4 at once.
import { keySpace } from '@sluice/protocol';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  startStack,
  type SluiceProcess,
  type Stack,
  type TestEngineSim,
} from '../support/index.ts';

let stack: Stack;
let sim: TestEngineSim;
let gateways: SluiceProcess[];

beforeAll(async () => {
  // Fast, but not instant: each answer takes tens of milliseconds of steps, far longer than a
  // release, so the four slots are really filled and the cap is exercised.
  stack = await startStack({
    sim: ['--max-num-seqs', '64', '--step-overhead-seconds', '0.005'],
    env: { ADMISSION_MAX_INFLIGHT: '4', VLLM_MAX_QUEUE_DEPTH: '1000' },
    dispatchers: 2,
    gateways: 3,
  });
  ({ sim, gateways } = stack);
});

afterAll(() => stack?.stop());

function body(i: number, stream: boolean) {
  return JSON.stringify({
    model: 'm',
    messages: [{ role: 'user', content: `request number ${i}` }],
    max_tokens: 8 + (i % 17),
    stream,
  });
}

async function send(base: string, payload: string) {
  const res = await fetch(`${base}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: payload,
  });
  return { status: res.status, text: await res.text() };
}

describe('hard global cap across gateway replicas', () => {
  it('200 concurrent requests (half streaming) over three gateways all complete, byte-identical to the engine, with the engine never above 4', async () => {
    await fetch(`${sim.url}/sim/peak/reset`, { method: 'POST' });
    const payloads = Array.from({ length: 200 }, (_, i) => body(i, i % 2 === 0));
    const viaSluice = await Promise.all(payloads.map((p, i) => send(gateways[i % 3]!.url, p)));
    const state = await sim.state();
    expect(state.peakRequests).toBeLessThanOrEqual(4);
    // The cap was reached, not merely respected by a trickle.
    expect(state.peakRequests).toBe(4);

    // The same requests straight to the engine (it takes 64 at once; answers are deterministic).
    const direct = await Promise.all(payloads.map((p) => send(sim.url, p)));
    for (let i = 0; i < payloads.length; i += 1) {
      // The body names the refusal, should there be one.
      expect(viaSluice[i]!.status, viaSluice[i]!.text).toBe(200);
      expect(viaSluice[i]!.text).toBe(direct[i]!.text);
    }
    expect(
      viaSluice.filter((_, i) => i % 2 === 0).every((r) => r.text.endsWith('data: [DONE]\n\n')),
    ).toBe(true);
  });

  it('leaves nothing in Redis once requests are answered', async () => {
    const { Redis } = await import('ioredis');
    const client = new Redis(stack.redis.url);
    // BullMQ's bookkeeping and Sluice's own per-pool keys share the pool's tag; jobs must not.
    const jobKeys = (await client.keys(keySpace().queueKey('default', '*'))).filter(
      (k) => !/:(meta|id|events|stalled-check|marker|pc|lease|stats)$/.test(k),
    );
    await client.quit();
    expect(jobKeys).toEqual([]);
  });

  it('works with the official openai client, streaming and not', async () => {
    const client = new OpenAI({ baseURL: `${gateways[1]!.url}/v1`, apiKey: 'unused' });
    const completion = await client.chat.completions.create({
      model: 'm',
      messages: [{ role: 'user', content: 'sdk' }],
      max_tokens: 6,
    });
    expect(completion.choices[0]!.message.content).toMatch(/\w/);
    expect(completion.usage!.completion_tokens).toBeLessThanOrEqual(6);

    const stream = await client.chat.completions.create({
      model: 'm',
      messages: [{ role: 'user', content: 'sdk' }],
      max_tokens: 6,
      stream: true,
    });
    let text = '';
    for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
    expect(text).toBe(completion.choices[0]!.message.content);

    const legacy = await client.completions.create({
      model: 'm',
      prompt: 'once upon',
      max_tokens: 4,
    });
    expect(legacy.choices[0]!.text.length).toBeGreaterThan(0);
    const models = await client.models.list();
    expect(models.data.map((m) => m.id)).toEqual(['m']);
  });
});
