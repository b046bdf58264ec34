import { describe, expect, it } from 'vitest';
import { defaultDegradation, loadConfig } from '../src/index.js';
import { configError, envError, fileError, files, loadFile } from './helpers.js';

describe('relay timeouts: silence timeout > 2 x liveness', () => {
  it('refuses a timeout of exactly twice the liveness period, naming both', () => {
    const error = envError({
      SLUICE_RELAY_LIVENESS_MS: '1000',
      SLUICE_RELAY_SILENCE_TIMEOUT_MS: '2000',
    });
    expect(error.variable).toBe('SLUICE_RELAY_SILENCE_TIMEOUT_MS');
    expect(error.message).toBe(
      'SLUICE_RELAY_SILENCE_TIMEOUT_MS="2000" is invalid: expected more than 2 x SLUICE_RELAY_LIVENESS_MS (1000), i.e. > 2000',
    );
  });

  it('accepts one millisecond more', () => {
    expect(
      loadConfig({ SLUICE_RELAY_LIVENESS_MS: '1000', SLUICE_RELAY_SILENCE_TIMEOUT_MS: '2001' })
        .relay,
    ).toEqual({ livenessMs: 1000, silenceTimeoutMs: 2001 });
  });

  it('blames the timeout when only it was set, against the default liveness', () => {
    expect(envError({ SLUICE_RELAY_SILENCE_TIMEOUT_MS: '1500' }).message).toBe(
      'SLUICE_RELAY_SILENCE_TIMEOUT_MS="1500" is invalid: expected more than 2 x SLUICE_RELAY_LIVENESS_MS (1000), i.e. > 2000',
    );
  });

  it('blames the liveness period when only it was set, against the default timeout', () => {
    const error = envError({ SLUICE_RELAY_LIVENESS_MS: '2500' });
    expect(error.variable).toBe('SLUICE_RELAY_LIVENESS_MS');
    expect(error.message).toBe(
      'SLUICE_RELAY_LIVENESS_MS="2500" is invalid: expected less than half of SLUICE_RELAY_SILENCE_TIMEOUT_MS (5000), i.e. < 2500',
    );
  });
});

describe('GPU_SOURCE=dcgm needs DCGM_URL', () => {
  it('refuses dcgm without a URL', () => {
    const error = envError({ GPU_SOURCE: 'dcgm' });
    expect(error.variable).toBe('DCGM_URL');
    expect(error.message).toMatch(
      /^DCGM_URL is unset: expected an http:\/\/ .* when GPU_SOURCE=dcgm$/,
    );
  });

  it('accepts dcgm with a URL', () => {
    expect(
      loadConfig({ GPU_SOURCE: 'dcgm', DCGM_URL: 'http://dcgm-exporter:9400/metrics' }).gpu,
    ).toEqual({ source: 'dcgm', dcgmUrl: 'http://dcgm-exporter:9400/metrics' });
  });
});

describe('SLUICE_CONFIG and VLLM_URL', () => {
  it('refuses both at once, with one message naming both', () => {
    const error = configError(() =>
      loadConfig(
        { SLUICE_CONFIG: '/etc/sluice.yaml', VLLM_URL: 'http://vllm:8000' },
        files({ '/etc/sluice.yaml': 'pools: []' }),
      ),
    );
    expect(error.variable).toBe('VLLM_URL');
    expect(error.message).toBe(
      'VLLM_URL="http://vllm:8000" is invalid: expected unset when SLUICE_CONFIG is set ("/etc/sluice.yaml"); list the engine in that file instead',
    );
  });

  it('makes one pool named default from VLLM_URL alone, model left for discovery', () => {
    const config = loadConfig({ VLLM_URL: 'http://vllm-0:8000/', VLLM_API_KEY: 'k' });
    expect(config.pools).toEqual([
      {
        name: 'default',
        models: [],
        engines: [
          {
            name: 'vllm-0:8000',
            url: 'http://vllm-0:8000',
            maxInflight: 256,
            capSource: 'default',
            apiKey: 'k',
            lane: 'any',
          },
        ],
        queueDepth: 8,
        maxParkSeconds: 120,
        degradation: defaultDegradation,
        longPrompts: {
          thresholdTokens: 8192,
          maxShare: 0.5,
          maxInPrefill: 1,
          agingSeconds: 60,
          kvFit: true,
        },
      },
    ]);
  });

  it('routes VLLM_MODEL to that pool when given, and names the engine with the default port', () => {
    const config = loadConfig({ VLLM_URL: 'https://vllm.example', VLLM_MODEL: 'llama' });
    expect(config.pools[0]?.models).toEqual(['llama']);
    expect(config.pools[0]?.engines[0]?.name).toBe('vllm.example:443');
    expect(config.pools[0]?.engines[0]).not.toHaveProperty('apiKey');
  });

  it('has no pools when neither is set', () => {
    expect(loadConfig({ VLLM_MODEL: 'llama' }).pools).toEqual([]);
  });

  it('names the file when it cannot be read', () => {
    const error = configError(() => loadConfig({ SLUICE_CONFIG: '/nope.yaml' }, files({})));
    expect(error.variable).toBe('SLUICE_CONFIG');
    expect(error.message).toBe(
      `SLUICE_CONFIG="/nope.yaml" is invalid: expected a readable file (ENOENT: no such file or directory, open '/nope.yaml')`,
    );
  });

  it('reads the file with fs by default', () => {
    const error = configError(() =>
      loadConfig({ SLUICE_CONFIG: '/definitely/not/here/sluice.yaml' }),
    );
    expect(error.message).toMatch(
      /^SLUICE_CONFIG=".*" is invalid: expected a readable file \(ENOENT/,
    );
  });
});

describe('SLUICE_POOLS names configured pools', () => {
  const yaml = [
    'pools:',
    '  - name: chat',
    '    models: [chat]',
    '    engines: [{ url: "http://e1:8000" }]',
    '  - name: code',
    '    models: [code]',
    '    engines: [{ url: "http://e2:8000" }]',
  ].join('\n');

  it('keeps the listed pools, in the order given', () => {
    expect(loadFile(yaml, { SLUICE_POOLS: 'code, chat' }).dispatcher.pools).toEqual([
      'code',
      'chat',
    ]);
  });

  it('leaves every pool allowed when unset', () => {
    expect(loadFile(yaml).dispatcher).not.toHaveProperty('pools');
  });

  it('refuses a name that is not a pool of the file, naming it and the pools there are', () => {
    const error = fileError(yaml, { SLUICE_POOLS: 'chat,vision' });
    expect(error.variable).toBe('SLUICE_POOLS');
    expect(error.message).toBe(
      'SLUICE_POOLS="chat,vision" is invalid: expected names of configured pools (chat, code); "vision" is not one',
    );
  });

  it('refuses any name when no pool is configured', () => {
    expect(envError({ SLUICE_POOLS: 'default' }).message).toBe(
      'SLUICE_POOLS="default" is invalid: expected names of configured pools (none); "default" is not one',
    );
  });
});
