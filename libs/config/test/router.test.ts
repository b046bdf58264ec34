import { describe, expect, it } from 'vitest';
import {
  createRouter,
  loadConfig,
  passthroughForModel,
  poolForModel,
  withDiscoveredModels,
  type SluiceConfig,
} from '../src/index.js';
import { configError, loadFile } from './helpers.js';

const config = loadFile(`
pools:
  - name: reasoning
    models: [reasoning, r1]
    engines: [{url: "http://vllm-0:8000"}]
  - name: chat
    models: [chat]
    engines: [{url: "http://vllm-1:8000"}]
passthrough:
  - model: text-embedding-3-small
    url: http://tei:8080
`);
const [reasoning, chat] = config.pools;

describe('createRouter', () => {
  const router = createRouter(config);

  it('routes each pool model to its pool and pass-through models to their URL', () => {
    expect(router.route('r1')).toEqual({ kind: 'pool', pool: reasoning });
    expect(router.route('reasoning')?.kind).toBe('pool');
    expect(router.route('chat')).toEqual({ kind: 'pool', pool: chat });
    expect(router.route('text-embedding-3-small')).toEqual({
      kind: 'passthrough',
      url: 'http://tei:8080',
    });
  });

  it('returns the pool object itself and the same route object every time (no allocation)', () => {
    const first = router.route('r1');
    expect(first?.kind === 'pool' && first.pool).toBe(reasoning);
    expect(router.route('r1')).toBe(first);
  });

  it('knows nothing else: case matters, prototype names are not models', () => {
    for (const model of ['R1', 'r1 ', '', 'unknown', '__proto__', 'constructor', 'toString'])
      expect(router.route(model), model).toBeUndefined();
  });

  it('sends a name routed nowhere to the pool that resolves LoRA adapters, if one does', () => {
    expect(router.resolver).toBeUndefined();
    const resolving = loadFile(`
pools:
  - name: base
    models: [llama]
    engines: [{url: "http://vllm-0:8000"}]
  - name: adapters
    models: [llama-lora]
    loraResolver: true
    engines: [{url: "http://vllm-1:8000"}]
`);
    const withResolver = createRouter(resolving);
    expect(withResolver.resolver).toEqual({ kind: 'pool', pool: resolving.pools[1] });
    // Named models still go where they are routed; the route is the pool's one object.
    expect(withResolver.route('llama')?.kind === 'pool' && withResolver.route('llama')).toEqual({
      kind: 'pool',
      pool: resolving.pools[0],
    });
    expect(withResolver.resolver).toBe(withResolver.route('llama-lora'));
    // Discovered names keep the pool's resolver.
    const grown = withDiscoveredModels(resolving, 'adapters', ['llama-lora', 'customer-7']);
    expect(createRouter(grown).resolver).toMatchObject({ pool: { name: 'adapters' } });
  });

  it('sends a request without a model to the pool only when it is the one destination', () => {
    // Several pools and a pass-through backend: no answer, the request must name its model.
    expect(router.unnamed).toBeUndefined();
    const single = loadConfig({ VLLM_URL: 'http://vllm:8000', VLLM_MODEL: 'm' });
    const only = createRouter(single);
    expect(only.unnamed).toEqual({ kind: 'pool', pool: single.pools[0] });
    // The route object a named request gets, allocated once.
    expect(only.unnamed).toBe(only.route('m'));
    // Known while the pool's model is still being discovered: the pool is the same.
    const discovering = loadConfig({ VLLM_URL: 'http://vllm:8000' });
    expect(createRouter(discovering).unnamed).toEqual({
      kind: 'pool',
      pool: discovering.pools[0],
    });
    // One pool beside a pass-through backend: two destinations.
    expect(
      createRouter({ ...single, passthrough: [{ model: 'emb', url: 'http://tei:8080' }] }).unnamed,
    ).toBeUndefined();
    expect(createRouter(loadConfig({})).unnamed).toBeUndefined();
  });

  it('refuses a hand-built config that routes one model twice', () => {
    const twice: SluiceConfig = {
      ...config,
      passthrough: [...config.passthrough, { model: 'chat', url: 'http://x:1' }],
    };
    const error = configError(() => createRouter(twice));
    expect(error.variable).toBe('passthrough[1].model');
    expect(error.message).toBe(
      'passthrough[1].model="chat" is invalid: expected a model not routed elsewhere (already at pools[1].models[0])',
    );
  });
});

describe('poolForModel and passthroughForModel', () => {
  it('find the pool or backend serving a model', () => {
    expect(poolForModel(config, 'chat')).toBe(chat);
    expect(poolForModel(config, 'text-embedding-3-small')).toBeUndefined();
    expect(passthroughForModel(config, 'text-embedding-3-small')).toBe(config.passthrough[0]);
    expect(passthroughForModel(config, 'chat')).toBeUndefined();
    expect(poolForModel(config, 'nope')).toBeUndefined();
  });

  it('work on a config with no pools', () => {
    expect(poolForModel(loadConfig({}), 'x')).toBeUndefined();
  });
});

describe('withDiscoveredModels', () => {
  const single = loadConfig({ VLLM_URL: 'http://vllm:8000' });

  it('returns a copy in which the pool serves the discovered model; the input is untouched', () => {
    const next = withDiscoveredModels(single, 'default', ['Qwen/Qwen3-8B']);
    expect(next.pools[0]?.models).toEqual(['Qwen/Qwen3-8B']);
    expect(single.pools[0]?.models).toEqual([]);
    expect(createRouter(next).route('Qwen/Qwen3-8B')).toEqual({
      kind: 'pool',
      pool: next.pools[0],
    });
    expect(poolForModel(single, 'Qwen/Qwen3-8B')).toBeUndefined();
  });

  it('refuses a model name the file rules would refuse', () => {
    const error = configError(() => withDiscoveredModels(single, 'default', ['ok', ' bad']));
    expect(error.variable).toBe('pools[0].models[1]');
    expect(error.message).toBe(
      'discovered model " bad" for pool default is invalid: expected a non-empty model name without surrounding blanks or control characters',
    );
  });

  it('refuses a model another pool or backend already serves', () => {
    expect(() => withDiscoveredModels(config, 'chat', ['chat', 'r1'])).toThrow(
      'pools[1].models[1]="r1" is invalid: expected a model not routed elsewhere (already at pools[0].models[1])',
    );
  });

  it('counts a name listed twice once', () => {
    expect(withDiscoveredModels(single, 'default', ['m', 'lora', 'm']).pools[0]?.models).toEqual([
      'm',
      'lora',
    ]);
  });

  it('with `refused`, leaves out and reports each name that fails, and serves the rest', () => {
    const refused: [string, string][] = [];
    const next = withDiscoveredModels(
      config,
      'chat',
      ['chat', 'sql-lora', 'r1', ' bad', 'text-embedding-3-small', 'sql-lora'],
      (model, reason) => refused.push([model, reason]),
    );
    expect(next.pools[1]?.models).toEqual(['chat', 'sql-lora']);
    // The other routes are untouched, and the result routes every name once.
    expect(next.pools[0]).toBe(reasoning);
    expect(createRouter(next).route('sql-lora')).toEqual({ kind: 'pool', pool: next.pools[1] });
    expect(createRouter(next).route('r1')).toEqual({ kind: 'pool', pool: reasoning });
    expect(refused).toEqual([
      ['r1', 'served by pool reasoning'],
      [' bad', 'expected a non-empty model name without surrounding blanks or control characters'],
      ['text-embedding-3-small', 'a pass-through model (http://tei:8080)'],
    ]);
    // A pool may drop models it served: they are its own.
    expect(withDiscoveredModels(next, 'chat', ['chat'], () => {}).pools[1]?.models).toEqual([
      'chat',
    ]);
  });

  it('refuses an unknown pool', () => {
    expect(configError(() => withDiscoveredModels(single, 'other', ['m'])).message).toBe(
      'pool "other" does not exist: expected one of default',
    );
  });
});
