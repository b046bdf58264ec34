// A stream's prefill is bounded by ENGINE_HEADERS_TIMEOUT_MS, not ENGINE_BODY_TIMEOUT_MS. vLLM
// (and the simulator) sends a stream's head at once and its first token after the prefill, so
// a body time-out running from the head cut every stream whose prefill outlasted it with an
// in-band engine_error, while the same request non-streamed succeeded. Here the body time-out
// is 0.5 s and the headers time-out 6 s: a 2 s prefill streams whole; a 30 s one ends in-band
// with engine_timeout, and the engine drops it.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  answer,
  chat,
  eventually,
  metricSum,
  startStack,
  untilReady,
  type Stack,
} from '../support/index.ts';

let stack: Stack;

beforeAll(async () => {
  stack = await startStack({
    // 1000 prompt tokens a second: `sim_prompt_tokens` says how long each prefill takes.
    sim: ['--step-overhead-seconds', '0.02', '--prefill-tokens-per-second', '1000'],
    env: {
      ENGINE_BODY_TIMEOUT_MS: '500',
      ENGINE_HEADERS_TIMEOUT_MS: '6000',
      SSE_HEARTBEAT_SECONDS: '1',
    },
  });
  await untilReady(stack.gateway);
});

afterAll(() => stack?.stop());

/** The `data:` events of an event stream, keep-alive comments left out. */
const events = (body: string) =>
  body
    .split('\n\n')
    .filter((e) => e.startsWith('data: '))
    .map((e) => e.slice('data: '.length));

const stream = (promptTokens: number) =>
  answer(
    chat(stack.gateway.url, 'long', {
      max_tokens: 5,
      sim_prompt_tokens: promptTokens,
      stream: true,
    }),
  );

describe("a stream's prefill", () => {
  it('may take longer than ENGINE_BODY_TIMEOUT_MS: a 2 s prefill streams whole', async () => {
    const a = await stream(2000);
    expect(a.status).toBe(200);
    const data = events(a.body);
    expect(data.filter((e) => e.includes('"error"'))).toEqual([]);
    expect(data.at(-1)).toBe('[DONE]');
    expect(data.length).toBeGreaterThan(1);
    expect(await metricSum(stack.dispatcher.url, 'sluice_completed_total', { outcome: 'ok' })).toBe(
      1,
    );
  });

  it('past ENGINE_HEADERS_TIMEOUT_MS ends in-band with engine_timeout, and the engine drops it', async () => {
    const { dispatcher, sim } = stack;
    const a = await stream(30_000);
    // The head went out with the engine's (or a keep-alive): the error can only be in-band.
    expect(a.status).toBe(200);
    // The error, then [DONE], as vLLM ends a failed stream; no token before them.
    const data = events(a.body);
    expect(data).toHaveLength(2);
    expect(data[1]).toBe('[DONE]');
    expect(JSON.parse(data[0]!)).toEqual({
      error: {
        message: expect.stringContaining(
          "sent no token within 6 s of its response head (ENGINE_HEADERS_TIMEOUT_MS; a stream's prefill must end within it)",
        ),
        type: 'server_error',
        param: null,
        code: 'engine_timeout',
      },
    });
    // The dispatcher's connection closed with the time-out: the engine aborts the prefill.
    await eventually(async () => {
      const state = await sim.state();
      return state.running + state.waiting === 0;
    }, 'the engine to drop the request');
    expect(
      await metricSum(dispatcher.url, 'sluice_completed_total', { outcome: 'engine_timeout' }),
    ).toBe(1);
  });
});
