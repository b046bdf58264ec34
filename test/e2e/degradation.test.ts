// Graceful degradation, driven by real load: the simulator's KV cache is filled by long
// prompts until the smoothed load enters each band, and requests released in that band
// reach the engine with the band's instruction and scaled max_tokens.
import { parseExposition, sampleValue } from '@sluice/engine-metrics';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  eventually,
  startStack,
  type SluiceProcess,
  type Stack,
  type TestEngineSim,
} from '../support/index.ts';

let stack: Stack;
let sim: TestEngineSim;
let gateway: SluiceProcess;
let dispatcher: SluiceProcess;
const load = new AbortController();

beforeAll(async () => {
  // 1,000 blocks of 16 = 16,000 KV tokens; slow decode keeps the load in place.
  // Default degradation profiles (normal < 0.75 <= tired < 0.90 <= lazy), KV usage as the
  // signal; the KV gate is moved out of the way so the lazy band can be reached.
  stack = await startStack({
    sim: [
      '--max-num-seqs',
      '64',
      '--num-gpu-blocks',
      '1000',
      '--max-model-len',
      '16000',
      '--decode-seconds-per-sequence',
      '0.05',
    ],
    env: {
      ADMISSION_MAX_INFLIGHT: '16',
      ADMISSION_KV_THRESHOLD: '0.99',
      ENGINE_SCRAPE_INTERVAL_MS: '100',
    },
  });
  ({ sim, gateway, dispatcher } = stack);
});

afterAll(async () => {
  load.abort();
  await stack?.stop();
});

async function loadState(): Promise<string | undefined> {
  const exposition = parseExposition(await (await fetch(`${dispatcher.url}/metrics`)).text());
  return ['normal', 'tired', 'lazy'].find(
    (state) => sampleValue(exposition, 'sluice_load_state', { state }) === 1,
  );
}

/** A long-running stream, sent straight to the engine, whose prompt occupies `tokens` of its KV cache. */
async function occupy(tokens: number) {
  const res = await fetch(`${sim.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({
      model: 'm',
      messages: [{ role: 'user', content: `load ${tokens}` }],
      sim_prompt_tokens: tokens,
      max_tokens: 1000,
      ignore_eos: true,
      stream: true,
    }),
    signal: load.signal,
  });
  await res.body!.getReader().read();
}

async function probe(endpoint: 'chat' | 'completion') {
  const path = endpoint === 'chat' ? '/v1/chat/completions' : '/v1/completions';
  const request =
    endpoint === 'chat'
      ? { messages: [{ role: 'user', content: `probe ${Math.random()}` }] }
      : { prompt: `probe ${Math.random()}` };
  const res = await fetch(`${gateway.url}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'm', max_tokens: 100, ...request }),
  });
  await res.text();
  const { requests } = (await (await fetch(`${sim.url}/sim/received`)).json()) as {
    requests: Array<{
      maxTokens: number;
      system: string | null;
      messages: number;
      userHead: string | null;
      promptHead: string | null;
    }>;
  };
  return { header: res.headers.get('x-sluice-load-state'), received: requests.at(-1)! };
}

describe('degradation under real load', () => {
  it('normal band (KV < 75 %): the request reaches the engine untouched', async () => {
    expect(await loadState()).toBe('normal');
    const { header, received } = await probe('chat');
    expect(header).toBe('normal');
    expect(received).toMatchObject({ maxTokens: 100, system: null });
  });

  it('tired band (75-90 %): "Answer concisely." and max_tokens x 0.7', async () => {
    await occupy(12_500); // 78 % of the cache
    await eventually(
      async () => ((await loadState()) === 'tired' ? true : undefined),
      'the load state to become tired',
    );
    const { header, received } = await probe('chat');
    expect(header).toBe('tired');
    // No system message is added (templates such as Gemma's refuse one): the instruction goes
    // in front of the first user message.
    expect(received).toMatchObject({ maxTokens: 70, system: null, messages: 1 });
    expect(received.userHead).toMatch(/^Answer concisely\.\n\nprobe /);
  });

  it('lazy band (>= 90 %): the article\'s "extremely short" instruction, max_tokens x 0.3, completions prefixed', async () => {
    await occupy(2_500); // 78 % + 16 % = 94 %
    await eventually(
      async () => ((await loadState()) === 'lazy' ? true : undefined),
      'the load state to become lazy',
    );
    const chat = await probe('chat');
    expect(chat.header).toBe('lazy');
    expect(chat.received).toMatchObject({ maxTokens: 30, system: null });
    expect(chat.received.userHead).toMatch(
      /^Provide extremely short answers only\. No explanations\. Code only if asked\.\n\nprobe /,
    );
    const completion = await probe('completion');
    expect(completion.header).toBe('lazy');
    expect(completion.received.maxTokens).toBe(30);
    expect(completion.received.promptHead).toMatch(
      /^Provide extremely short answers only\. No explanations\. Code only if asked\.\n\nprobe /,
    );
  });

  it('returns to normal once the load is gone, and counts the degraded requests per state', async () => {
    load.abort();
    await eventually(
      async () => ((await loadState()) === 'normal' ? true : undefined),
      'the load state to return to normal',
    );
    const exposition = parseExposition(await (await fetch(`${dispatcher.url}/metrics`)).text());
    expect(sampleValue(exposition, 'sluice_degraded_requests_total', { state: 'tired' })).toBe(1);
    expect(sampleValue(exposition, 'sluice_degraded_requests_total', { state: 'lazy' })).toBe(2);
    const { header, received } = await probe('chat');
    expect(header).toBe('normal');
    expect(received.system).toBeNull();
    expect(received.userHead).toMatch(/^probe /);
  });
});
