// `n` > 1 and /v1/completions prompt batches over HTTP: one engine sequence per (prompt,
// choice), as vLLM V1 fans such a request out (async_llm.py "Fan out child requests (for
// n>1)", serving_completion.py one generator per prompt). The server runs in this process
// from the sources.
import { parseExposition } from '@sluice/engine-metrics';
import { eventually } from '@sluice/test/support';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseSimOptions } from '../src/options.ts';
import { createEngineSim, type EngineSim } from '../src/server.ts';

interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
}

interface Choice {
  index: number;
  message?: { content: string };
  text?: string;
  finish_reason: string;
}

interface Body {
  choices: Choice[];
  usage: Usage;
}

interface Chunk {
  choices: Array<{
    index: number;
    delta?: { content?: string; role?: string };
    text?: string;
    finish_reason: string | null;
  }>;
  usage?: Usage;
}

async function start(args: string[]): Promise<{ sim: EngineSim; url: string }> {
  const sim = createEngineSim(parseSimOptions(['--port', '0', ...args], {}));
  const url = await sim.app.listen({ host: '127.0.0.1', port: 0 });
  return { sim, url };
}

function post(url: string, path: string, body: unknown, signal?: AbortSignal) {
  return fetch(`${url}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
    signal,
  });
}

async function json(url: string, path: string, body: unknown): Promise<Body> {
  const res = await post(url, path, body);
  expect(res.status).toBe(200);
  return (await res.json()) as Body;
}

/** The `data:` payloads of an SSE body, [DONE] left out (and checked last). */
async function chunks(res: Response): Promise<Chunk[]> {
  expect(res.status).toBe(200);
  const events = (await res.text()).split('\n\n').filter((e) => e !== '');
  expect(events.at(-1)).toBe('data: [DONE]');
  return events.slice(0, -1).map((e) => JSON.parse(e.slice('data: '.length)) as Chunk);
}

const textOf = (c: Choice) => c.message?.content ?? c.text ?? '';

describe('n and prompt batches over HTTP (instant profile)', () => {
  let sim: EngineSim;
  let url: string;
  beforeAll(async () => {
    ({ sim, url } = await start(['--profile', 'instant', '--model', 'm']));
  });
  afterAll(() => sim.close());

  const messages = [{ role: 'user', content: 'Sixteen letters.' }]; // 4 prompt tokens

  it('answers a chat request with n choices, usage counting the prompt once', async () => {
    const request = { model: 'm', messages, max_tokens: 5, ignore_eos: true };
    const one = await json(url, '/v1/chat/completions', request);
    const three = await json(url, '/v1/chat/completions', { ...request, n: 3 });
    expect(three.choices.map((c) => c.index)).toEqual([0, 1, 2]);
    expect(three.choices.map((c) => c.finish_reason)).toEqual(['length', 'length', 'length']);
    expect(textOf(three.choices[0]!)).toBe(textOf(one.choices[0]!));
    expect(new Set(three.choices.map(textOf)).size).toBe(3);
    // serving_chat.py: prompt_tokens once, completion_tokens summed over the outputs.
    expect(three.usage).toEqual({ prompt_tokens: 4, total_tokens: 19, completion_tokens: 15 });
  });

  it('streams every chat choice under its index, roles first, and sums usage', async () => {
    const request = { model: 'm', messages, n: 2, max_tokens: 4, ignore_eos: true };
    const plain = await json(url, '/v1/chat/completions', request);
    const streamed = await chunks(
      await post(url, '/v1/chat/completions', {
        ...request,
        stream: true,
        stream_options: { include_usage: true },
      }),
    );
    expect(streamed.every((c) => c.choices.length <= 1)).toBe(true);
    expect(streamed.slice(0, 2).map((c) => [c.choices[0]!.index, c.choices[0]!.delta])).toEqual([
      [0, { role: 'assistant', content: '' }],
      [1, { role: 'assistant', content: '' }],
    ]);
    for (const choice of plain.choices) {
      const own = streamed.flatMap((c) => c.choices.filter((ch) => ch.index === choice.index));
      expect(own.map((ch) => ch.delta?.content ?? '').join('')).toBe(textOf(choice));
      expect(own.map((ch) => ch.finish_reason).filter((r) => r !== null)).toEqual(['length']);
    }
    expect(streamed.at(-1)!.choices).toEqual([]);
    expect(streamed.at(-1)!.usage).toEqual(plain.usage);
    expect(plain.usage.completion_tokens).toBe(8);
  });

  it('answers a completions batch with index = prompt_idx * n + choice_idx', async () => {
    const prompts = ['abcd', 'abcdefgh']; // 1 and 2 prompt tokens
    const request = { model: 'm', prompt: prompts, n: 2, max_tokens: 3, ignore_eos: true };
    const batch = await json(url, '/v1/completions', request);
    expect(batch.choices.map((c) => c.index)).toEqual([0, 1, 2, 3]);
    // Each prompt's first choice is the answer to that prompt alone.
    for (const [p, prompt] of prompts.entries()) {
      const alone = await json(url, '/v1/completions', { ...request, prompt, n: 1 });
      expect(textOf(batch.choices[p * 2]!)).toBe(textOf(alone.choices[0]!));
    }
    // serving_completion.py: prompt tokens once per prompt, completion tokens of every choice.
    expect(batch.usage).toEqual({ prompt_tokens: 3, total_tokens: 15, completion_tokens: 12 });

    const streamed = await chunks(
      await post(url, '/v1/completions', {
        ...request,
        stream: true,
        stream_options: { include_usage: true },
      }),
    );
    for (const choice of batch.choices) {
      const own = streamed.flatMap((c) => c.choices.filter((ch) => ch.index === choice.index));
      expect(own.map((ch) => ch.text).join('')).toBe(textOf(choice));
    }
    expect(streamed.at(-1)!.usage).toEqual(batch.usage);
  });

  it('answers a batch of token-id prompts', async () => {
    const body = await json(url, '/v1/completions', {
      model: 'm',
      prompt: [
        [1, 2, 3],
        [4, 5],
      ],
      max_tokens: 2,
      ignore_eos: true,
    });
    expect(body.choices.map((c) => c.index)).toEqual([0, 1]);
    expect(body.usage).toEqual({ prompt_tokens: 5, total_tokens: 9, completion_tokens: 4 });
  });

  it('refuses n = 0 in vLLM error shape and sends nothing to the engine', async () => {
    const before = (await (await fetch(`${url}/sim/state`)).json()) as Record<string, number>;
    const res = await post(url, '/v1/chat/completions', { model: 'm', messages, n: 0 });
    expect(res.status).toBe(400);
    expect(await res.json()).toEqual({
      error: {
        message: 'n must be at least 1, got 0.',
        type: 'BadRequestError',
        param: null,
        code: 400,
      },
    });
    const after = (await (await fetch(`${url}/sim/state`)).json()) as Record<string, number>;
    expect(after['receivedSequencesTotal']).toBe(before['receivedSequencesTotal']);
  });

  it('finishes every choice as its own request in vllm:request_success_total', async () => {
    const successes = async () =>
      parseExposition(await (await fetch(`${url}/metrics`)).text())
        .samples.filter((s) => s.name === 'vllm:request_success_total')
        .reduce((sum, s) => sum + s.value, 0);
    const before = await successes();
    await json(url, '/v1/completions', { model: 'm', prompt: ['a', 'b'], n: 3, max_tokens: 2 });
    expect((await successes()) - before).toBe(6);
  });
});

describe('n and prompt batches in the scheduler', () => {
  let sim: EngineSim;
  let url: string;
  beforeAll(async () => {
    ({ sim, url } = await start(['--profile', 'instant', '--model', 'm', '--max-num-seqs', '4']));
  });
  afterAll(() => sim.close());

  const state = async () =>
    (await (await fetch(`${url}/sim/state`)).json()) as Record<string, number>;
  const gauge = (text: string, name: string) =>
    parseExposition(text).samples.find((s) => s.name === name)!.value;

  it('counts each (prompt, choice) as a sequence, and a disconnect aborts them all', async () => {
    await fetch(`${url}/sim/peak/reset`, { method: 'POST' });
    const controller = new AbortController();
    const res = await post(
      url,
      '/v1/completions',
      {
        model: 'm',
        prompt: ['first prompt', 'second prompt'],
        n: 3,
        max_tokens: 100_000,
        ignore_eos: true,
        stream: true,
      },
      controller.signal,
    );
    await res.body!.getReader().read(); // tokens flow: the batch is in the engine
    const during = await state();
    // 2 prompts x n = 3: six engine requests, four of them in the batch (--max-num-seqs 4).
    expect([during['running'], during['waiting']]).toEqual([4, 2]);
    expect(during['peakRequests']).toBe(6);
    expect(during['receivedTotal']).toBe(1);
    expect(during['receivedSequencesTotal']).toBe(6);
    const metrics = await (await fetch(`${url}/metrics`)).text();
    expect(gauge(metrics, 'vllm:num_requests_running')).toBe(4);
    expect(gauge(metrics, 'vllm:num_requests_waiting')).toBe(2);
    expect(gauge(metrics, 'sim_peak_requests')).toBe(6);
    const received = (await (await fetch(`${url}/sim/received`)).json()) as {
      requests: Array<{ n: number; sequences: number }>;
    };
    expect(received.requests.at(-1)).toMatchObject({ n: 3, sequences: 6 });

    controller.abort();
    const after = await eventually(async () => {
      const s = await state();
      return s['running'] === 0 && s['waiting'] === 0 ? s : undefined;
    }, 'every sequence of the request to leave the engine');
    expect(after['usedBlocks']).toBe(0);
  });

  it('drops a stream after the configured number of tokens over all its choices, freeing them all', async () => {
    await fetch(`${url}/sim/faults`, {
      method: 'PUT',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ dropStreamAfterTokens: 3 }),
    });
    const res = await post(url, '/v1/chat/completions', {
      model: 'm',
      messages: [{ role: 'user', content: 'hi' }],
      n: 3,
      max_tokens: 50,
      ignore_eos: true,
      stream: true,
    });
    const failure = await res.text().catch((err: unknown) => err);
    expect(failure).toBeInstanceOf(Error);
    await fetch(`${url}/sim/faults`, {
      method: 'PUT',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ dropStreamAfterTokens: null }),
    });
    const after = await eventually(async () => {
      const s = await state();
      return s['running'] === 0 && s['waiting'] === 0 ? s : undefined;
    }, 'the dropped sequences to be freed');
    expect(after['usedBlocks']).toBe(0);
  });
});
