import { describe, expect, it } from 'vitest';
import { loadConfig } from '../src/index.js';
import { loadFile } from './helpers.js';

const ENGINE = { VLLM_URL: 'http://vllm-0:8000' };

describe('per-engine cap: ADMISSION_MAX_INFLIGHT, then VLLM_MAX_NUM_SEQS, then 256', () => {
  it("uses 256 (vLLM's --max-num-seqs below 70 GiB) and says so", () => {
    const config = loadConfig(ENGINE);
    expect(config.pools[0]?.engines[0]?.maxInflight).toBe(256);
    expect(config.pools[0]?.engines[0]?.capSource).toBe('default');
  });

  it('uses VLLM_MAX_NUM_SEQS when it is the only one set', () => {
    const config = loadConfig({ ...ENGINE, VLLM_MAX_NUM_SEQS: '48' });
    expect(config.pools[0]?.engines[0]?.maxInflight).toBe(48);
    expect(config.pools[0]?.engines[0]?.capSource).toBe('VLLM_MAX_NUM_SEQS');
  });

  it('prefers ADMISSION_MAX_INFLIGHT over VLLM_MAX_NUM_SEQS', () => {
    const config = loadConfig({ ...ENGINE, VLLM_MAX_NUM_SEQS: '48', ADMISSION_MAX_INFLIGHT: '12' });
    expect(config.pools[0]?.engines[0]?.maxInflight).toBe(12);
    expect(config.pools[0]?.engines[0]?.capSource).toBe('ADMISSION_MAX_INFLIGHT');
  });

  it('still validates VLLM_MAX_NUM_SEQS when ADMISSION_MAX_INFLIGHT wins', () => {
    expect(() => loadConfig({ ADMISSION_MAX_INFLIGHT: '3', VLLM_MAX_NUM_SEQS: '0' })).toThrow(
      /^VLLM_MAX_NUM_SEQS="0"/,
    );
  });
});

describe('YAML values over environment defaults', () => {
  const yaml = `
pools:
  - name: reasoning
    models: [reasoning, r1]
    maxInflight: 4
    queueDepth: 2
    maxParkSeconds: 30
    engines:
      - url: http://vllm-0:8000
      - url: http://vllm-1:8000
        maxInflight: 2
  - name: chat
    models: [chat]
    engines:
      - url: http://vllm-2:8000
`;
  const env = {
    ADMISSION_MAX_INFLIGHT: '64',
    VLLM_MAX_QUEUE_DEPTH: '20',
    ADMISSION_MAX_PARK_SECONDS: '90',
  };

  it('engine value over pool value over env default', () => {
    const [reasoning, chat] = loadFile(yaml, env).pools;
    expect(reasoning?.engines.map((e) => e.maxInflight)).toEqual([4, 2]);
    expect(chat?.engines.map((e) => e.maxInflight)).toEqual([64]);
  });

  it('pool queueDepth and maxParkSeconds over VLLM_MAX_QUEUE_DEPTH and ADMISSION_MAX_PARK_SECONDS', () => {
    const [reasoning, chat] = loadFile(yaml, env).pools;
    expect([reasoning?.queueDepth, reasoning?.maxParkSeconds]).toEqual([2, 30]);
    expect([chat?.queueDepth, chat?.maxParkSeconds]).toEqual([20, 90]);
  });

  it("says for each engine where its cap came from: the file's, whatever the other engines use", () => {
    const sources = (config: ReturnType<typeof loadFile>) =>
      config.pools.flatMap((p) => p.engines.map((e) => e.capSource));
    expect(sources(loadFile(yaml, env))).toEqual(['config', 'config', 'ADMISSION_MAX_INFLIGHT']);
    // Only the engine nobody capped may follow its engine's max_num_seqs (engine-slot.ts).
    expect(sources(loadFile(yaml))).toEqual(['config', 'config', 'default']);
    const all = yaml.replace('    models: [chat]\n', '    models: [chat]\n    maxInflight: 8\n');
    expect(loadFile(all, env).pools[1]?.engines[0]?.maxInflight).toBe(8);
    expect(sources(loadFile(all, env))).toEqual(['config', 'config', 'config']);
  });

  it('gives file engines VLLM_API_KEY unless they name their own apiKey', () => {
    const config = loadFile(
      `pools:
  - name: p
    models: [m]
    engines:
      - url: http://a:1
      - url: http://b:1
        apiKey: own-key
`,
      { VLLM_API_KEY: 'shared-key' },
    );
    expect(config.pools[0]?.engines.map((e) => e.apiKey)).toEqual(['shared-key', 'own-key']);
  });
});
