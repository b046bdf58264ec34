// The simulator as a real process, through its HTTP API.
import { parseExposition } from '@sluice/engine-metrics';
import { eventually, startEngineSim, type TestEngineSim } from '@sluice/test/support';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

const json = { 'content-type': 'application/json' };

function post(sim: TestEngineSim, path: string, body: unknown, signal?: AbortSignal) {
  return fetch(`${sim.url}${path}`, {
    method: 'POST',
    headers: json,
    body: typeof body === 'string' ? body : JSON.stringify(body),
    signal,
  });
}

interface Chunk {
  choices: Array<{
    delta?: { content?: string; role?: string };
    text?: string;
    finish_reason: string | null;
  }>;
  usage?: { prompt_tokens: number; completion_tokens: number; total_tokens: number };
}

/** Reads an SSE body into its `data:` payloads. */
async function sse(res: Response): Promise<string[]> {
  const text = await res.text();
  expect(text.endsWith('data: [DONE]\n\n')).toBe(true);
  return text
    .split('\n\n')
    .filter((event) => event !== '')
    .map((event) => {
      expect(event.startsWith('data: ')).toBe(true);
      return event.slice('data: '.length);
    });
}

describe('engine-sim over HTTP (instant profile)', () => {
  let sim: TestEngineSim;
  beforeAll(async () => {
    sim = await startEngineSim(['--profile', 'instant', '--model', 'm']);
  });
  afterAll(() => sim.stop());

  it('lists the served model', async () => {
    const body = (await (await fetch(`${sim.url}/v1/models`)).json()) as {
      data: Array<{ id: string; max_model_len: number }>;
    };
    expect(body.data.map((m) => m.id)).toEqual(['m']);
    expect(body.data[0]!.max_model_len).toBe(131072);
  });

  it('answers chat streaming and non-streaming with the same text, finish reason and usage', async () => {
    const request = {
      model: 'm',
      messages: [{ role: 'user', content: 'What is admission control?' }],
      max_tokens: 12,
    };
    const plain = (await (await post(sim, '/v1/chat/completions', request)).json()) as {
      choices: Array<{ message: { content: string }; finish_reason: string }>;
      usage: Chunk['usage'];
    };
    const res = await post(sim, '/v1/chat/completions', {
      ...request,
      stream: true,
      stream_options: { include_usage: true },
    });
    expect(res.headers.get('content-type')).toBe('text/event-stream; charset=utf-8');
    const events = await sse(res);
    expect(events.at(-1)).toBe('[DONE]');
    const chunks = events.slice(0, -1).map((e) => JSON.parse(e) as Chunk);
    expect(chunks[0]!.choices[0]!.delta).toEqual({ role: 'assistant', content: '' });
    const streamed = chunks.flatMap((c) => c.choices.map((ch) => ch.delta?.content ?? '')).join('');
    const finish = chunks
      .flatMap((c) => c.choices.map((ch) => ch.finish_reason))
      .filter((r) => r !== null);
    expect(streamed).toBe(plain.choices[0]!.message.content);
    expect(finish).toEqual([plain.choices[0]!.finish_reason]);
    expect(chunks.at(-1)!.choices).toEqual([]);
    expect(chunks.at(-1)!.usage).toEqual(plain.usage);
    expect(plain.usage!.prompt_tokens).toBe(Math.ceil('What is admission control?'.length / 4));
    expect(plain.usage!.completion_tokens).toBeLessThanOrEqual(12);
  });

  it('answers completions streaming and non-streaming with the same text', async () => {
    const request = { model: 'm', prompt: 'Once upon a time', max_tokens: 8, ignore_eos: true };
    const plain = (await (await post(sim, '/v1/completions', request)).json()) as {
      object: string;
      choices: Array<{ text: string; finish_reason: string }>;
      usage: { completion_tokens: number };
    };
    expect(plain.object).toBe('text_completion');
    expect(plain.usage.completion_tokens).toBe(8);
    expect(plain.choices[0]!.finish_reason).toBe('length');
    const events = await sse(await post(sim, '/v1/completions', { ...request, stream: true }));
    const chunks = events.slice(0, -1).map((e) => JSON.parse(e) as Chunk);
    expect(chunks).toHaveLength(8);
    expect(chunks.map((c) => c.choices[0]!.text).join('')).toBe(plain.choices[0]!.text);
  });

  it('returns the same bytes for the same request (deterministic output)', async () => {
    const request = { model: 'm', messages: [{ role: 'user', content: 'repeat me' }] };
    const a = await (await post(sim, '/v1/chat/completions', request)).text();
    const b = await (await post(sim, '/v1/chat/completions', request)).text();
    const c = await (
      await post(sim, '/v1/chat/completions', {
        ...request,
        messages: [{ role: 'user', content: 'another prompt' }],
      })
    ).text();
    expect(a).toBe(b);
    expect(JSON.parse(c).choices[0].message.content).not.toBe(
      JSON.parse(a).choices[0].message.content,
    );
  });

  it('counts prompt tokens from sim_prompt_tokens when the request states it', async () => {
    const body = (await (
      await post(sim, '/v1/completions', {
        model: 'm',
        prompt: 'x',
        max_tokens: 1,
        sim_prompt_tokens: 5000,
      })
    ).json()) as {
      usage: { prompt_tokens: number };
    };
    expect(body.usage.prompt_tokens).toBe(5000);
  });

  it.each([
    ['malformed JSON', '{"model": "m",', 400, /JSON/],
    ['a body that is not an object', '[1,2]', 400, /JSON object/],
    [
      'a model that is not a string',
      { model: 5, messages: [{ role: 'user', content: 'x' }] },
      400,
      /model must be a string/,
    ],
    [
      'a non-integer max_tokens',
      { model: 'm', messages: [{ role: 'user', content: 'x' }], max_tokens: 1.5 },
      400,
      /max_tokens must be a positive integer/,
    ],
    ['empty messages', { model: 'm', messages: [] }, 400, /messages must be a non-empty array/],
    [
      'stream_options without stream',
      {
        model: 'm',
        messages: [{ role: 'user', content: 'x' }],
        stream_options: { include_usage: true },
      },
      400,
      /stream=True/,
    ],
    [
      'a prompt over max_model_len',
      {
        model: 'm',
        messages: [{ role: 'user', content: 'x' }],
        sim_prompt_tokens: 131000,
        max_tokens: 1000,
      },
      400,
      /maximum context length is 131072 tokens/,
    ],
    [
      'an unknown model',
      { model: 'other', messages: [{ role: 'user', content: 'x' }] },
      404,
      /The model `other` does not exist/,
    ],
  ])('refuses %s in vLLM error shape', async (_name, body, status, message) => {
    const res = await post(sim, '/v1/chat/completions', body);
    expect(res.status).toBe(status);
    const error = ((await res.json()) as { error: { message: string; code: number; type: string } })
      .error;
    expect(error.message).toMatch(message);
    expect(error.code).toBe(status);
    expect(error.type).toBe(status === 404 ? 'NotFoundError' : 'BadRequestError');
  });

  it('exposes metrics in which every line parses under the Prometheus text format, with vLLM names and labels', async () => {
    await (
      await post(sim, '/v1/chat/completions', {
        model: 'm',
        messages: [{ role: 'user', content: 'count me' }],
        max_tokens: 3,
        ignore_eos: true,
      })
    ).text();
    const res = await fetch(`${sim.url}/metrics`);
    expect(res.headers.get('content-type')).toBe('text/plain; version=0.0.4; charset=utf-8');
    const exposition = parseExposition(await res.text());
    const one = (name: string) => exposition.samples.filter((s) => s.name === name);
    for (const name of [
      'vllm:num_requests_running',
      'vllm:num_requests_waiting',
      'vllm:kv_cache_usage_perc',
    ]) {
      expect(one(name)).toHaveLength(1);
      expect(one(name)[0]!.labels).toEqual({ model_name: 'm', engine: '0' });
      expect(exposition.families.get(name)?.type).toBe('gauge');
    }
    expect(one('vllm:generation_tokens_total')[0]!.value).toBeGreaterThanOrEqual(3);
    expect(one('vllm:generation_tokens_created')[0]!.value).toBeGreaterThan(1.7e9);
    expect(exposition.families.get('vllm:prompt_tokens_total')?.type).toBe('counter');
    const cacheInfo = one('vllm:cache_config_info')[0]!;
    expect(
      Number(cacheInfo.labels['num_gpu_blocks']) * Number(cacheInfo.labels['block_size']),
    ).toBe(65536 * 16);
    for (const h of [
      'vllm:time_to_first_token_seconds',
      'vllm:request_queue_time_seconds',
      'vllm:request_prefill_time_seconds',
    ]) {
      expect(exposition.families.get(h)?.type).toBe('histogram');
      const inf = one(`${h}_bucket`).find((s) => s.labels['le'] === '+Inf')!;
      expect(inf.value).toBe(one(`${h}_count`)[0]!.value);
      expect(one(`${h}_created`)).toHaveLength(1);
    }
    expect(one('vllm:num_preemptions_total')).toHaveLength(1);
  });

  it('aborts the sequence and frees its KV blocks when a streaming client disconnects', async () => {
    const controller = new AbortController();
    const res = await post(
      sim,
      '/v1/chat/completions',
      {
        model: 'm',
        messages: [{ role: 'user', content: 'a long answer please' }],
        max_tokens: 100000,
        ignore_eos: true,
        stream: true,
      },
      controller.signal,
    );
    const reader = res.body!.getReader();
    await reader.read(); // the stream is producing tokens: the sequence holds blocks
    const during = await sim.state();
    expect(during.running).toBe(1);
    expect(during.usedBlocks).toBeGreaterThan(0);
    controller.abort();
    const after = await eventually(async () => {
      const s = await sim.state();
      return s.running === 0 ? s : undefined;
    }, 'the aborted sequence to leave the engine');
    expect(after.usedBlocks).toBe(0);
    expect(after.kvUsage).toBe(0);
  });

  it('records in brief what it was sent, so a rewrite upstream can be checked', async () => {
    await (
      await post(sim, '/v1/chat/completions', {
        model: 'm',
        messages: [
          { role: 'system', content: 'Answer concisely.' },
          { role: 'user', content: 'what was sent?' },
        ],
        max_tokens: 7,
      })
    ).text();
    await (
      await post(sim, '/v1/completions', { model: 'm', prompt: 'Be brief.\n\nOnce', max_tokens: 2 })
    ).text();
    const { requests } = (await (await fetch(`${sim.url}/sim/received`)).json()) as {
      requests: Array<Record<string, unknown>>;
    };
    expect(requests.at(-2)).toMatchObject({
      endpoint: 'chat',
      maxTokens: 7,
      maxCompletionTokens: null,
      system: 'Answer concisely.',
      messages: 2,
    });
    expect(requests.at(-1)).toMatchObject({
      endpoint: 'completion',
      maxTokens: 2,
      system: null,
      promptHead: 'Be brief.\n\nOnce',
    });
  });

  it('records the highest running + waiting it ever held', async () => {
    await fetch(`${sim.url}/sim/peak/reset`, { method: 'POST' });
    const controller = new AbortController();
    const streams = await Promise.all(
      Array.from({ length: 5 }, (_, i) =>
        post(
          sim,
          '/v1/completions',
          { model: 'm', prompt: `p${i}`, max_tokens: 100000, ignore_eos: true, stream: true },
          controller.signal,
        ),
      ),
    );
    // Every stream has produced a token, so all five were in the engine at once.
    await Promise.all(streams.map((res) => res.body!.getReader().read()));
    controller.abort();
    expect((await sim.state()).peakRequests).toBe(5);
    const peak = parseExposition(await sim.metricsText()).samples.find(
      (s) => s.name === 'sim_peak_requests',
    )!;
    expect(peak.value).toBe(5);
  });
});

describe('engine-sim faults', () => {
  let sim: TestEngineSim;
  beforeAll(async () => {
    sim = await startEngineSim([
      '--profile',
      'instant',
      '--model',
      'm',
      '--startup-delay-seconds',
      '600',
    ]);
  });
  afterAll(() => sim.stop());

  const chat = (extra: Record<string, unknown> = {}) =>
    post(sim, '/v1/chat/completions', {
      model: 'm',
      messages: [{ role: 'user', content: 'hi' }],
      max_tokens: 4,
      ...extra,
    });

  it('answers /health 503 and refuses requests until ready, then 200', async () => {
    expect((await fetch(`${sim.url}/health`)).status).toBe(503);
    expect((await chat()).status).toBe(503);
    expect((await sim.setFaults({ ready: true })).status).toBe(200);
    expect((await fetch(`${sim.url}/health`)).status).toBe(200);
    expect((await chat()).status).toBe(200);
  });

  it('fails /metrics with 500, or answers with text that is not vLLM, on demand', async () => {
    await sim.setFaults({ metrics: 'error' });
    expect((await fetch(`${sim.url}/metrics`)).status).toBe(500);
    await sim.setFaults({ metrics: 'not-vllm' });
    const text = await sim.metricsText();
    expect(parseExposition(text).samples.some((s) => s.name.startsWith('vllm:'))).toBe(false);
    await sim.setFaults({ metrics: 'ok' });
    expect(
      parseExposition(await sim.metricsText()).samples.some(
        (s) => s.name === 'vllm:num_requests_running',
      ),
    ).toBe(true);
  });

  it('answers exactly the configured share of requests with 500', async () => {
    await sim.setFaults({ errorRate: 0.25 });
    const statuses = [];
    for (let i = 0; i < 8; i += 1) statuses.push((await chat()).status);
    await sim.setFaults({ errorRate: 0 });
    expect(statuses.filter((s) => s === 500)).toHaveLength(2);
    expect(statuses.filter((s) => s === 200)).toHaveLength(6);
  });

  it('drops a stream mid-way after the configured number of tokens, and frees the sequence', async () => {
    await sim.setFaults({ dropStreamAfterTokens: 3 });
    const res = await chat({ stream: true, max_tokens: 50, ignore_eos: true });
    expect(res.status).toBe(200);
    const reader = res.body!.getReader();
    let received = '';
    const failure = await (async () => {
      for (;;) {
        const { done, value } = await reader.read();
        if (done) return undefined;
        received += new TextDecoder().decode(value);
      }
    })().catch((err: unknown) => err);
    expect(failure).toBeInstanceOf(Error);
    expect(received).toContain('"role":"assistant"');
    expect(received).not.toContain('[DONE]');
    await sim.setFaults({ dropStreamAfterTokens: null });
    const state = await eventually(async () => {
      const s = await sim.state();
      return s.running === 0 ? s : undefined;
    }, 'the dropped sequence to be freed');
    expect(state.usedBlocks).toBe(0);
  });

  it('rejects an invalid fault with a message naming the field', async () => {
    const res = await sim.setFaults({ errorRate: 2 });
    expect(res.status).toBe(400);
    expect(((await res.json()) as { error: { message: string } }).error.message).toMatch(
      /errorRate must be a number from 0 to 1/,
    );
    const unknown = await sim.setFaults({ explode: true });
    expect(((await unknown.json()) as { error: { message: string } }).error.message).toMatch(
      /unknown fault "explode"/,
    );
  });

  it('holds /metrics for the configured delay when slow metrics are switched on', async () => {
    await sim.setFaults({ metrics: 'slow', metricsDelayMs: 60_000 });
    // A scraper with a tight timeout gives up long before the minute-long delay ends.
    await expect(
      fetch(`${sim.url}/metrics`, { signal: AbortSignal.timeout(100) }),
    ).rejects.toThrow();
    await sim.setFaults({ metrics: 'ok' });
    expect((await fetch(`${sim.url}/metrics`)).status).toBe(200);
  });
});
