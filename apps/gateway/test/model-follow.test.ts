// The routes follow what the engines list: a LoRA adapter loaded at runtime (vLLM's
// /v1/load_lora_adapter, or a LoRA resolver) appears in /v1/models with `parent` set to its
// base model, and is routed to that model's pool from the next read of the cards on, whether
// the pool's models were discovered or configured. Stand-in engines: small HTTP servers whose
// /v1/models answers what the test says at the moment.
import { once } from 'node:events';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { loadConfig, type SluiceConfig } from '@sluice/config';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { discoverModels, ModelFollower } from '../src/discovery.ts';
import { ModelCards } from '../src/model-cards.ts';
import { Routing } from '../src/routing.ts';

/** What each engine lists now; undefined: it answers 503 (away). */
const listing = new Map<string, object[] | undefined>();
const servers: Server[] = [];
const urls: string[] = [];

beforeAll(async () => {
  for (let i = 0; i < 3; i += 1) {
    const server = createServer((_req, res) => {
      const data = listing.get(urls[i]!);
      res.writeHead(data === undefined ? 503 : 200, { 'content-type': 'application/json' });
      res.end(data === undefined ? '' : JSON.stringify({ object: 'list', data }));
    });
    server.listen(0, '127.0.0.1');
    await once(server, 'listening');
    servers.push(server);
    urls.push(`http://127.0.0.1:${(server.address() as AddressInfo).port}`);
  }
});
afterAll(() => {
  for (const server of servers) server.close();
});

/** A card as vLLM writes it (`show_available_models`): a base model has parent null. */
const card = (id: string, parent: string | null = null) => ({
  id,
  object: 'model',
  created: 1_796_190_058,
  owned_by: 'vllm',
  root: parent === null ? `/models/${id}` : `/adapters/${id}`,
  parent,
  ...(parent === null ? { max_model_len: 8192 } : {}),
});

const signal = new AbortController().signal;

function logger() {
  const lines: { level: string; o: object; m: string }[] = [];
  return {
    lines,
    info: (o: object, m: string) => void lines.push({ level: 'info', o, m }),
    warn: (o: object, m: string) => void lines.push({ level: 'warn', o, m }),
  };
}

/** A replica's routing as main.ts runs it: discovery first, then the cards and the follower. */
async function replica(loaded: SluiceConfig) {
  const log = logger();
  const routing = new Routing(loaded);
  if (!routing.known) routing.update(await discoverModels(loaded, log, signal));
  const cards = new ModelCards();
  const follower = new ModelFollower(loaded, log);
  return {
    log,
    routing,
    cards,
    /** One periodic read of the cards (MODEL_CARDS_REFRESH_MS). */
    read: () => follower.read(cards, routing, signal),
    routed: (model: string) => {
      const route = routing.router.route(model);
      return route?.kind === 'pool' ? route.pool.name : route?.kind;
    },
    listed: () => cards.list(routing.config).map((c) => c.id),
  };
}

describe('routes that follow the engines', () => {
  it('a discovered pool gains an adapter loaded after start, and loses it once a read shows it gone', async () => {
    listing.set(urls[0]!, [card('llama')]);
    const r = await replica(loadConfig({ VLLM_URL: urls[0]! }));
    await r.read();
    expect(r.routed('llama')).toBe('default');
    expect(r.routed('sql-lora')).toBeUndefined();

    // POST /v1/load_lora_adapter on the engine: vLLM lists it from then on.
    listing.set(urls[0]!, [card('llama'), card('sql-lora', 'llama')]);
    // Not before the next read: nothing between reads changes the routes.
    expect(r.routed('sql-lora')).toBeUndefined();
    const next = await r.read();
    expect(next?.pools[0]?.models).toEqual(['llama', 'sql-lora']);
    expect(r.routed('sql-lora')).toBe('default');
    // GET /v1/models lists it with the engine's own card, parent included.
    expect(r.cards.list(r.routing.config)).toContainEqual(card('sql-lora', 'llama'));
    expect(r.log.lines).toContainEqual(
      expect.objectContaining({
        level: 'info',
        o: { pool: 'default', added: ['sql-lora'], removed: [] },
      }),
    );
    // A read that changes nothing leaves the routing alone.
    const router = r.routing.router;
    expect(await r.read()).toBeUndefined();
    expect(r.routing.router).toBe(router);

    // The engine away: what was read last stays routed.
    listing.set(urls[0]!, undefined);
    expect(await r.read()).toBeUndefined();
    expect(r.routed('sql-lora')).toBe('default');

    // Unloaded (POST /v1/unload_lora_adapter): gone from the routes and the list at the next read.
    listing.set(urls[0]!, [card('llama')]);
    await r.read();
    expect(r.routed('sql-lora')).toBeUndefined();
    expect(r.routed('llama')).toBe('default');
    expect(r.listed()).toEqual(['llama']);
  });

  it('a configured pool routes the adapters of its models, and no other model its engine lists', async () => {
    // With --lora-modules the adapters are there from the start; VLLM_MODEL names the base.
    listing.set(urls[0]!, [
      card('llama'),
      card('sql-lora', 'llama'),
      card('other-base'),
      card('other-lora', 'other-base'),
    ]);
    const r = await replica(loadConfig({ VLLM_URL: urls[0]!, VLLM_MODEL: 'llama' }));
    expect(r.routed('sql-lora')).toBeUndefined();
    await r.read();
    expect(r.routed('llama')).toBe('default');
    expect(r.routed('sql-lora')).toBe('default');
    expect(r.routed('other-base')).toBeUndefined();
    expect(r.routed('other-lora')).toBeUndefined();
    expect(r.listed()).toEqual(['llama', 'sql-lora']);
    // An adapter loaded later follows the same rule; the configured model stays whatever is listed.
    listing.set(urls[0]!, [card('tuned', 'llama')]);
    await r.read();
    expect(r.routing.config.pools[0]?.models).toEqual(['llama', 'tuned']);
    expect(r.routed('sql-lora')).toBeUndefined();
  });

  it("never takes another pool's or a pass-through backend's model, and says so once", async () => {
    // The code pool first: its reads come first, and still cannot take the chat pool's routes.
    const yaml = `pools:
  - name: code
    models: [coder]
    engines: [{ url: "${urls[1]}" }]
  - name: chat
    models: [llama]
    engines: [{ url: "${urls[0]}" }]
passthrough:
  - { model: emb, url: "http://127.0.0.1:1" }
`;
    listing.set(urls[0]!, [card('llama'), card('chat-lora', 'llama')]);
    listing.set(urls[1]!, [card('coder')]);
    const r = await replica(loadConfig({ SLUICE_CONFIG: '/etc/sluice.yaml' }, () => yaml));
    await r.read();
    expect(r.routed('chat-lora')).toBe('chat');
    expect(r.routed('coder')).toBe('code');
    // The code pool's engine loads adapters named as the chat pool's models and the
    // pass-through model (operator error): the routes in place win.
    listing.set(urls[1]!, [
      card('coder'),
      card('llama', 'coder'),
      card('chat-lora', 'coder'),
      card('emb', 'coder'),
      card('code-lora', 'coder'),
    ]);
    await r.read();
    await r.read();
    expect(r.routed('llama')).toBe('chat');
    expect(r.routed('chat-lora')).toBe('chat');
    expect(r.routed('emb')).toBe('passthrough');
    expect(r.routed('code-lora')).toBe('code');
    const warned = r.log.lines.filter((l) => l.level === 'warn');
    expect(warned.map((l) => l.o)).toEqual([
      { pool: 'code', model: 'llama', reason: 'served by pool chat' },
      { pool: 'code', model: 'chat-lora', reason: 'served by pool chat' },
      { pool: 'code', model: 'emb', reason: 'a pass-through model (http://127.0.0.1:1)' },
    ]);
  });
});
