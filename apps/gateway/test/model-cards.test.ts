// GET /v1/models behind Sluice lists the engines' own cards, as a client would read them from
// vLLM. Real HTTP engines that answer what a test says; the config is a pools file.
import { once } from 'node:events';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { loadConfig, type SluiceConfig } from '@sluice/config';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { EngineModelsError, fetchModelCards, ModelCards } from '../src/model-cards.ts';

/** What each engine answers to GET /v1/models: a status and a body. */
const answers = new Map<string, { status: number; body: string }>();
const engines: Server[] = [];
const urls: string[] = [];

const vllmCard = (id: string, maxModelLen: number) => ({
  id,
  object: 'model',
  created: 1_796_190_058,
  owned_by: 'vllm',
  root: `/models/${id}`,
  parent: null,
  max_model_len: maxModelLen,
});

beforeAll(async () => {
  for (let i = 0; i < 3; i += 1) {
    const server = createServer((req, res) => {
      const answer = answers.get(urls[i]!) ?? { status: 503, body: '' };
      res.writeHead(answer.status, { 'content-type': 'application/json' });
      res.end(answer.body);
    });
    server.listen(0, '127.0.0.1');
    await once(server, 'listening');
    engines.push(server);
    urls.push(`http://127.0.0.1:${(server.address() as AddressInfo).port}`);
  }
});

afterAll(() => {
  for (const server of engines) server.close();
});

function config(): SluiceConfig {
  const yaml = `pools:
  - name: chat
    models: [m, alias]
    engines: [{ url: "${urls[0]}" }, { url: "${urls[1]}" }]
  - name: other
    models: [o]
    engines: [{ url: "${urls[2]}" }]
passthrough:
  - { model: emb, url: "http://127.0.0.1:1" }
`;
  return loadConfig({ SLUICE_CONFIG: '/etc/sluice.yaml' }, () => yaml);
}

const list = (...cards: unknown[]) => JSON.stringify({ object: 'list', data: cards });

describe('the model list', () => {
  it("serves each pool's models with its own engines' cards, and Sluice's own card for the rest", async () => {
    // The pool's first engine is away; the second answers. The other pool's engine lists a
    // card for `m` too, which must not describe the chat pool's `m`.
    answers.set(urls[0]!, { status: 503, body: '' });
    answers.set(urls[1]!, { status: 200, body: list(vllmCard('m', 131_072)) });
    answers.set(urls[2]!, { status: 200, body: list(vllmCard('o', 8192), vllmCard('m', 1)) });
    const cards = new ModelCards();
    const before = cards.list(config());
    expect(before.map((c) => c.owned_by)).toEqual(['sluice', 'sluice', 'sluice', 'sluice']);

    await cards.refresh(config(), new AbortController().signal);
    expect(cards.list(config())).toEqual([
      vllmCard('m', 131_072),
      { id: 'alias', object: 'model', created: 0, owned_by: 'sluice' },
      vllmCard('o', 8192),
      { id: 'emb', object: 'model', created: 0, owned_by: 'sluice' },
    ]);
  });

  it('keeps the cards it read while every engine of the pool is away', async () => {
    answers.set(urls[0]!, { status: 200, body: list(vllmCard('m', 4096)) });
    const cards = new ModelCards();
    await cards.refresh(config(), new AbortController().signal);
    answers.set(urls[0]!, { status: 500, body: '' });
    answers.set(urls[1]!, { status: 500, body: '' });
    await cards.refresh(config(), new AbortController().signal);
    expect(cards.list(config())[0]).toEqual(vllmCard('m', 4096));
  });
});

describe('fetchModelCards', () => {
  it('refuses an answer that is not a model list, and leaves out cards without an id', async () => {
    const engine = { url: urls[0]! };
    const signal = new AbortController().signal;
    answers.set(urls[0]!, { status: 200, body: '{"models":[]}' });
    await expect(fetchModelCards(engine, signal)).rejects.toThrow(EngineModelsError);
    answers.set(urls[0]!, { status: 200, body: 'not json' });
    await expect(fetchModelCards(engine, signal)).rejects.toThrow(/no `data` list/);
    answers.set(urls[0]!, { status: 401, body: '{}' });
    await expect(fetchModelCards(engine, signal)).rejects.toThrow(/answered 401/);
    answers.set(urls[0]!, { status: 200, body: list({ object: 'model' }, { id: 'm' }, 'x') });
    expect(await fetchModelCards(engine, signal)).toEqual([
      { id: 'm', object: 'model', created: 0, owned_by: 'vllm' },
    ]);
  });
});
