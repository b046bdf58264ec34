// A non-streamed request the engine is still generating when ENGINE_HEADERS_TIMEOUT_MS runs
// out (vLLM sends such an answer's head only with its whole body): the client gets 504
// `engine_timeout` in the OpenAI shape and no Retry-After, since a retry would take as long
// again, not 503 `engine_unreachable` with a 5 s one; and the engine stops generating it.
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
    // Every step takes 0.2 s: the 200 tokens asked for take 40 s, far past the timeout.
    sim: ['--step-overhead-seconds', '0.2'],
    env: { ENGINE_HEADERS_TIMEOUT_MS: '500' },
  });
  await untilReady(stack.gateway);
});

afterAll(() => stack?.stop());

describe('an engine slower than ENGINE_HEADERS_TIMEOUT_MS', () => {
  it('answers a non-streamed request 504 engine_timeout without Retry-After, and the engine drops it', async () => {
    const { gateway, dispatcher, sim } = stack;
    const a = await answer(
      chat(gateway.url, 'write a long essay', { max_tokens: 200, ignore_eos: true }),
    );
    expect(a).toMatchObject({ status: 504, reason: 'engine_timeout', retryAfter: null });
    expect(JSON.parse(a.body)).toEqual({
      error: {
        message: expect.stringContaining('did not answer within 0.5 s (ENGINE_HEADERS_TIMEOUT_MS'),
        type: 'server_error',
        param: null,
        code: 'engine_timeout',
      },
    });
    // The dispatcher's connection closed with the timeout: the engine aborts the generation.
    await eventually(async () => {
      const state = await sim.state();
      return state.running + state.waiting === 0 && state.receivedTotal === 1;
    }, 'the engine to drop the request');
    expect(
      await metricSum(dispatcher.url, 'sluice_completed_total', { outcome: 'engine_timeout' }),
    ).toBe(1);
  });
});
