// Requests that become several engine requests: vLLM V1 runs each of `n` choices, and each
// prompt of a /v1/completions batch, as a request of its own (vllm/v1/engine/async_llm.py
// `add_request`), each counted in its running and waiting gauges. The cap counts them all: 16
// connections of such requests in front of cap 4 never put more than 4 on the engine, every
// request is answered whole once, and one that could never fit is refused at once.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { answer, metricSum, startStack, type Stack } from '../support/index.ts';

const CONNECTIONS = 16;
const PER_CONNECTION = 4;
// Each answer takes a few engine steps: the slots stay full while the queue backs up.
const SIM_ARGS = ['--max-num-seqs', '64', '--step-overhead-seconds', '0.002'];

interface Shape {
  path: '/v1/chat/completions' | '/v1/completions';
  body: Record<string, unknown>;
  /** Engine requests it becomes. */
  sequences: number;
  stream: boolean;
}

/** One of four shapes: a plain chat, n = 3, a streamed n = 2, a batch of two prompts with n = 2. */
function shape(k: number, mark: string): Shape {
  const sampled = { temperature: 0.7, max_tokens: 4 };
  switch (k % 4) {
    case 0:
      return {
        path: '/v1/chat/completions',
        body: { model: 'm', messages: [{ role: 'user', content: mark }], ...sampled },
        sequences: 1,
        stream: false,
      };
    case 1:
      return {
        path: '/v1/chat/completions',
        body: { model: 'm', messages: [{ role: 'user', content: mark }], n: 3, ...sampled },
        sequences: 3,
        stream: false,
      };
    case 2:
      return {
        path: '/v1/chat/completions',
        body: {
          model: 'm',
          messages: [{ role: 'user', content: mark }],
          n: 2,
          stream: true,
          ...sampled,
        },
        sequences: 2,
        stream: true,
      };
    default:
      return {
        path: '/v1/completions',
        body: { model: 'm', prompt: [`${mark} a`, `${mark} b`], n: 2, ...sampled },
        sequences: 4,
        stream: false,
      };
  }
}

function post(base: string, path: string, body: unknown) {
  return answer(
    fetch(`${base}${path}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(body),
    }),
  );
}

describe('requests of several engine requests under the cap', () => {
  let stack: Stack;
  beforeAll(async () => {
    stack = await startStack({
      sim: SIM_ARGS,
      env: { ADMISSION_MAX_INFLIGHT: '4', VLLM_MAX_QUEUE_DEPTH: '1000' },
    });
  });
  afterAll(() => stack?.stop());

  it('16 connections of n > 1 and batches at cap 4: the engine never holds more than 4, each answered once', async () => {
    const { sim, gateway, dispatcher } = stack;
    await fetch(`${sim.url}/sim/peak/reset`, { method: 'POST' });
    const before = await sim.state();
    const connection = async (c: number) => {
      const out = [];
      for (let i = 0; i < PER_CONNECTION; i += 1) {
        const s = shape(c + i, `c${c}-r${i}`);
        out.push({ ...s, ...(await post(gateway.url, s.path, s.body)) });
      }
      return out;
    };
    const answers = (
      await Promise.all(Array.from({ length: CONNECTIONS }, (_, c) => connection(c)))
    ).flat();

    let sequences = 0;
    for (const a of answers) {
      expect(a.status, a.body.slice(0, 200)).toBe(200);
      sequences += a.sequences;
      if (a.stream) {
        expect(a.body.endsWith('data: [DONE]\n\n')).toBe(true);
        const indices = new Set(
          a.body
            .split('\n\n')
            .filter((e) => e.startsWith('data: {'))
            .flatMap((e) =>
              (JSON.parse(e.slice(6)) as { choices: { index: number }[] }).choices.map(
                (ch) => ch.index,
              ),
            ),
        );
        expect([...indices].sort()).toEqual([0, 1]);
      } else {
        expect((JSON.parse(a.body) as { choices: unknown[] }).choices).toHaveLength(a.sequences);
      }
    }
    const state = await sim.state();
    // Every engine request ran once, and never more than the cap at a time.
    expect((state.receivedTotal as number) - (before.receivedTotal as number)).toBe(
      CONNECTIONS * PER_CONNECTION,
    );
    expect(
      (state.receivedSequencesTotal as number) - (before.receivedSequencesTotal as number),
    ).toBe(sequences);
    expect(state.peakRequests).toBeLessThanOrEqual(4);
    expect(await metricSum(dispatcher.url, 'sluice_released_total')).toBe(
      CONNECTIONS * PER_CONNECTION,
    );
  });

  it('refuses a request wider than the cap with 400 and runs nothing of it', async () => {
    const { sim, gateway } = stack;
    const before = (await sim.state()).receivedTotal as number;
    const wide = await post(gateway.url, '/v1/completions', {
      model: 'm',
      prompt: ['a', 'b', 'c'],
      n: 2,
      temperature: 0.7,
      max_tokens: 4,
    });
    expect(wide.status).toBe(400);
    expect(wide.reason).toBe('bad_request');
    expect(JSON.parse(wide.body)).toMatchObject({
      error: {
        type: 'invalid_request_error',
        code: 'bad_request',
        message: expect.stringContaining('makes 6 engine requests'),
      },
    });
    const zero = await post(gateway.url, '/v1/chat/completions', {
      model: 'm',
      messages: [{ role: 'user', content: 'hi' }],
      n: 0,
    });
    expect(zero.status).toBe(400);
    expect(JSON.parse(zero.body).error.message).toBe('n must be a positive integer or null');
    expect((await sim.state()).receivedTotal).toBe(before);
  });
});
