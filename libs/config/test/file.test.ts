import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { loadConfig } from '../src/index.js';
import { configError, fileError, loadFile } from './helpers.js';

const FULL = `
pools:
  - name: reasoning
    models: [reasoning, r1]
    maxInflight: 4
    queueDepth: 8
    maxParkSeconds: 120
    engines:
      - url: http://vllm-0:8000
        name: vllm-0
        maxInflight: 4
        apiKey: abc
      - url: http://vllm-1:8000/
passthrough:
  - model: text-embedding-3-small
    url: http://tei:8080
`;

/** A valid file with one line replaced, so each error case is a one-line change. */
const pool = (extra = '', engine = 'url: http://vllm-0:8000') => `
pools:
  - name: p
    models: [m]
${extra}    engines:
      - ${engine}
`;

describe('SLUICE_CONFIG: a valid file', () => {
  it('reads pools, engines and pass-through models', () => {
    expect(loadFile(FULL)).toMatchObject({
      pools: [
        {
          name: 'reasoning',
          models: ['reasoning', 'r1'],
          queueDepth: 8,
          maxParkSeconds: 120,
          engines: [
            {
              name: 'vllm-0',
              url: 'http://vllm-0:8000',
              maxInflight: 4,
              capSource: 'config',
              apiKey: 'abc',
            },
            { name: 'vllm-1:8000', url: 'http://vllm-1:8000', maxInflight: 4, capSource: 'config' },
          ],
        },
      ],
      passthrough: [{ model: 'text-embedding-3-small', url: 'http://tei:8080' }],
    });
  });

  it('accepts a file with only pass-through backends, or empty lists', () => {
    expect(loadFile('passthrough:\n  - model: e\n    url: http://tei:80\n').pools).toEqual([]);
    expect(loadFile('pools: []\npassthrough: []\n')).toMatchObject({ pools: [], passthrough: [] });
  });

  it("reads a pool's longPrompts block key by key over the ADMISSION_LONG_* variables, and engine lanes", () => {
    const config = loadFile(
      `
pools:
  - name: p
    models: [m]
    longPrompts: { thresholdTokens: 4096, agingSeconds: 30 }
    engines:
      - { url: http://vllm-0:8000, lane: long }
      - { url: http://vllm-1:8000 }
`,
      { ADMISSION_LONG_MAX_SHARE: '0.25' },
    );
    expect(config.pools[0]!.longPrompts).toEqual({
      thresholdTokens: 4096,
      maxShare: 0.25,
      maxInPrefill: 1,
      agingSeconds: 30,
      kvFit: true,
    });
    expect(config.pools[0]!.engines.map((e) => e.lane)).toEqual(['long', 'any']);
  });

  it('refuses a pool whose lanes leave short or long prompts nowhere to go', () => {
    const error = configError(() => loadFile(pool('', '{ url: http://vllm-0:8000, lane: long }')));
    expect(error.variable).toBe('pools[0].engines');
    expect(error.message).toBe(
      '/etc/sluice.yaml: pools[0].engines=["long"] is invalid: expected at least one engine with lane any or short (short prompts would have nowhere to go)',
    );
    expect(() => loadFile(pool('', '{ url: http://vllm-0:8000, lane: wide }'))).toThrow(
      'pools[0].engines[0].lane="wide" is invalid: expected one of any, long, short',
    );
    expect(() => loadFile(pool('    longPrompts: { maxShare: 0 }\n'))).toThrow(
      'pools[0].longPrompts.maxShare=0 is invalid',
    );
    expect(() => loadFile(pool('    longPrompts: { kvFit: "yes" }\n'))).toThrow(
      'pools[0].longPrompts.kvFit="yes" is invalid: expected true or false',
    );
  });

  it('reads loraResolver, in one pool at most', () => {
    expect(loadFile(pool('    loraResolver: true\n')).pools[0]!.loraResolver).toBe(true);
    expect(loadFile(pool('    loraResolver: false\n')).pools[0]).not.toHaveProperty('loraResolver');
    expect(loadFile(pool()).pools[0]).not.toHaveProperty('loraResolver');
    expect(() => loadFile(pool('    loraResolver: "on"\n'))).toThrow(
      'pools[0].loraResolver="on" is invalid: expected true or false',
    );
    const two = `
pools:
  - name: a
    models: [a]
    loraResolver: true
    engines: [{url: "http://vllm-0:8000"}]
  - name: b
    models: [b]
    loraResolver: true
    engines: [{url: "http://vllm-1:8000"}]
`;
    expect(configError(() => loadFile(two)).message).toBe(
      '/etc/sluice.yaml: pools[1].loraResolver=true is invalid: expected true in one pool at most (already at pools[0].loraResolver: a name routed nowhere else can go to one pool only)',
    );
  });

  it('reads a real file from disk by default', () => {
    const dir = mkdtempSync(join(tmpdir(), 'sluice-config-'));
    try {
      const path = join(dir, 'sluice.yaml');
      writeFileSync(path, FULL);
      expect(loadConfig({ SLUICE_CONFIG: path }).pools[0]?.name).toBe('reasoning');
    } finally {
      rmSync(dir, { recursive: true });
    }
  });
});

describe('SLUICE_CONFIG: errors name the file and the path', () => {
  it.each([
    [
      'a bad engine URL',
      pool('', 'url: ftp://vllm-0'),
      'pools[0].engines[0].url',
      '/etc/sluice.yaml: pools[0].engines[0].url="ftp://vllm-0" is invalid: expected an http:// or https:// origin without path, credentials or query, e.g. http://vllm-0:8000',
    ],
    [
      'an engine URL with a path (such as /v1)',
      pool('', 'url: http://vllm-0:8000/v1'),
      'pools[0].engines[0].url',
      '/etc/sluice.yaml: pools[0].engines[0].url="http://vllm-0:8000/v1" is invalid: expected an http:// or https:// origin without path, credentials or query, e.g. http://vllm-0:8000',
    ],
    [
      'a typo in a pool key',
      pool('    queueDepht: 3\n'),
      'pools[0].queueDepht',
      '/etc/sluice.yaml: pools[0].queueDepht is not a known key: expected one of name, models, maxInflight, queueDepth, maxParkSeconds, engines, degradation, longPrompts, loraResolver',
    ],
    [
      'a typo in an engine key',
      pool('', 'url: http://e:1\n        maxInFlight: 3'),
      'pools[0].engines[0].maxInFlight',
      '/etc/sluice.yaml: pools[0].engines[0].maxInFlight is not a known key: expected one of url, name, maxInflight, apiKey, lane',
    ],
    [
      'a typo at the top level',
      'pool: []\n',
      'pool',
      '/etc/sluice.yaml: pool is not a known key: expected one of pools, passthrough, degradation, tenants',
    ],
    [
      'a fractional cap',
      pool('    maxInflight: 4.5\n'),
      'pools[0].maxInflight',
      '/etc/sluice.yaml: pools[0].maxInflight=4.5 is invalid: expected an integer >= 1',
    ],
    [
      'a cap written as a string',
      pool('', 'url: http://e:1\n        maxInflight: "4"'),
      'pools[0].engines[0].maxInflight',
      '/etc/sluice.yaml: pools[0].engines[0].maxInflight="4" is invalid: expected an integer >= 1',
    ],
    [
      'a negative queue depth',
      pool('    queueDepth: -1\n'),
      'pools[0].queueDepth',
      '/etc/sluice.yaml: pools[0].queueDepth=-1 is invalid: expected an integer >= 1',
    ],
    [
      // Every request passes the queue: the admission script refuses at queued >= depth, so
      // a depth of 0 would leave the pool refusing everything.
      'a queue depth of 0',
      pool('    queueDepth: 0\n'),
      'pools[0].queueDepth',
      '/etc/sluice.yaml: pools[0].queueDepth=0 is invalid: expected an integer >= 1',
    ],
    [
      'a zero park time',
      pool('    maxParkSeconds: 0\n'),
      'pools[0].maxParkSeconds',
      '/etc/sluice.yaml: pools[0].maxParkSeconds=0 is invalid: expected a number > 0 and <= 2147483',
    ],
    [
      'a bad pool name',
      pool().replace('name: p', 'name: Big Pool'),
      'pools[0].name',
      `/etc/sluice.yaml: pools[0].name="Big Pool" is invalid: expected 1 to 63 lower-case letters, digits or '-'`,
    ],
    [
      'a missing pool name',
      pool().replace('name: p', 'name:'),
      'pools[0].name',
      `/etc/sluice.yaml: pools[0].name is missing: expected 1 to 63 lower-case letters, digits or '-'`,
    ],
    [
      'missing engines',
      'pools:\n  - name: p\n    models: [m]\n',
      'pools[0].engines',
      '/etc/sluice.yaml: pools[0].engines is missing: expected a non-empty list of engines',
    ],
    [
      'an empty engine list',
      'pools:\n  - name: p\n    models: [m]\n    engines: []\n',
      'pools[0].engines',
      '/etc/sluice.yaml: pools[0].engines=[] is invalid: expected a non-empty list of engines',
    ],
    [
      'an empty model list',
      pool().replace('models: [m]', 'models: []'),
      'pools[0].models',
      '/etc/sluice.yaml: pools[0].models=[] is invalid: expected a non-empty list of model names',
    ],
    [
      'a model that is not a string',
      pool().replace('models: [m]', 'models: [m, 7]'),
      'pools[0].models[1]',
      '/etc/sluice.yaml: pools[0].models[1]=7 is invalid: expected a non-empty model name without surrounding blanks or control characters',
    ],
    [
      'a model list written as a string',
      pool().replace('models: [m]', 'models: m'),
      'pools[0].models',
      '/etc/sluice.yaml: pools[0].models="m" is invalid: expected a non-empty list of model names',
    ],
    [
      'an engine without url',
      pool('', 'name: e'),
      'pools[0].engines[0].url',
      '/etc/sluice.yaml: pools[0].engines[0].url is missing: expected an http:// or https:// origin without path, credentials or query, e.g. http://vllm-0:8000',
    ],
    [
      'an engine that is a bare string',
      pool('', 'http://vllm-0:8000'),
      'pools[0].engines[0]',
      '/etc/sluice.yaml: pools[0].engines[0]="http://vllm-0:8000" is invalid: expected a mapping with keys url, name, maxInflight, apiKey, lane',
    ],
    [
      'pools as a mapping',
      'pools:\n  p: {}\n',
      'pools',
      '/etc/sluice.yaml: pools={"p":{}} is invalid: expected a list of pools',
    ],
    [
      'an empty file',
      '',
      '(document)',
      '/etc/sluice.yaml: (document)=null is invalid: expected a mapping with keys pools, passthrough, degradation, tenants',
    ],
    [
      'a pass-through entry without url',
      'passthrough:\n  - model: e\n',
      'passthrough[0].url',
      '/etc/sluice.yaml: passthrough[0].url is missing: expected an http:// or https:// origin without path, credentials or query, e.g. http://vllm-0:8000',
    ],
    [
      'a typo in a pass-through entry',
      'passthrough:\n  - model: e\n    uri: http://x\n',
      'passthrough[0].uri',
      '/etc/sluice.yaml: passthrough[0].uri is not a known key: expected one of model, url, apiKey',
    ],
  ])('%s', (_what, yaml, variable, message) => {
    const error = fileError(yaml);
    expect(error.variable).toBe(variable);
    expect(error.message).toBe(message);
  });

  it('shows an engine apiKey only by length', () => {
    const error = fileError(pool('', 'url: http://e:1\n        apiKey: "sk secret"'));
    expect(error.message).toBe(
      '/etc/sluice.yaml: pools[0].engines[0].apiKey=(hidden, 9 characters) is invalid: expected a token of visible ASCII characters (no blanks or newlines)',
    );
  });

  it('reports YAML syntax errors on one line with their position', () => {
    const error = fileError('pools: [\n');
    expect(error.variable).toBe('SLUICE_CONFIG');
    expect(error.message).toMatch(
      /^\/etc\/sluice\.yaml: not valid YAML: .* at line \d+, column \d+$/,
    );
  });

  it('refuses duplicate keys, unknown tags and several documents', () => {
    expect(fileError('pools: []\npools: []\n').message).toMatch(
      /not valid YAML: Map keys must be unique/,
    );
    expect(fileError('pools: !!js/function "x"\n').message).toMatch(/not valid YAML: .*tag/i);
    expect(fileError('pools: []\n---\npools: []\n').message).toMatch(
      /not valid YAML: .*multiple documents/,
    );
  });

  it('refuses an alias bomb instead of expanding it', () => {
    const lines = ['a0: &a0 [x, x, x, x, x, x, x, x, x, x]'];
    for (let i = 1; i < 10; i += 1)
      lines.push(
        `a${i}: &a${i} [${Array(10)
          .fill(`*a${i - 1}`)
          .join(', ')}]`,
      );
    expect(fileError(lines.join('\n')).message).toMatch(/^\/etc\/sluice\.yaml: not valid YAML: /);
  });

  it('refuses __proto__ as an unknown key rather than touching prototypes', () => {
    const error = fileError(pool('    __proto__: {maxInflight: 1}\n'));
    expect(error.variable).toBe('pools[0].__proto__');
  });
});

describe('SLUICE_CONFIG: uniqueness', () => {
  it('refuses a model routed by two pools, naming both places', () => {
    const error = fileError(`
pools:
  - name: a
    models: [chat, r1]
    engines: [{url: "http://a:1"}]
  - name: b
    models: [r1]
    engines: [{url: "http://b:1"}]
`);
    expect(error.variable).toBe('pools[1].models[0]');
    expect(error.message).toBe(
      '/etc/sluice.yaml: pools[1].models[0]="r1" is invalid: expected a model not routed elsewhere (already at pools[0].models[1])',
    );
  });

  it('refuses a model listed twice in one pool', () => {
    expect(fileError(pool().replace('models: [m]', 'models: [m, m]')).variable).toBe(
      'pools[0].models[1]',
    );
  });

  it('refuses a pass-through model that a pool already serves', () => {
    const error = fileError(`${pool()}passthrough:\n  - model: m\n    url: http://tei:80\n`);
    expect(error.message).toBe(
      '/etc/sluice.yaml: passthrough[0].model="m" is invalid: expected a model not routed elsewhere (already at pools[0].models[0])',
    );
  });

  it("refuses a pass-through backend that is a pool's engine: it would bypass the cap", () => {
    // vLLM answers every name it serves (--served-model-name a b, LoRA adapters).
    const error = fileError(`
pools:
  - {name: a, models: [x], engines: [{url: "http://vllm:8000"}]}
passthrough:
  - {model: y, url: "http://VLLM:8000/"}
`);
    expect(error.variable).toBe('passthrough[0].url');
    expect(error.message).toContain(
      "expected a backend that is not a pool's engine (it is pools[0].engines[0]: its requests would bypass that engine's cap",
    );
  });

  it('refuses two pools with one name', () => {
    const error = fileError(`
pools:
  - {name: a, models: [x], engines: [{url: "http://a:1"}]}
  - {name: a, models: [y], engines: [{url: "http://b:1"}]}
`);
    expect(error.message).toBe(
      '/etc/sluice.yaml: pools[1].name="a" is invalid: expected a name not used by another pool (pools[0])',
    );
  });

  it('refuses one engine in two pools: each dispatcher would apply its own cap', () => {
    const error = fileError(`
pools:
  - {name: a, models: [x], engines: [{url: "http://VLLM:80"}]}
  - {name: b, models: [y], engines: [{url: "http://vllm/"}]}
`);
    expect(error.variable).toBe('pools[1].engines[0].url');
    expect(error.message).toContain('already at pools[0].engines[0]');
  });

  it('refuses derived engine names that collide, and says to set name', () => {
    const error = fileError(`
pools:
  - name: a
    models: [x]
    engines: [{url: "http://vllm:8000"}, {url: "https://vllm:8000"}]
`);
    expect(error.message).toBe(
      '/etc/sluice.yaml: pools[0].engines[1].name="vllm:8000" is invalid: expected a name not used by another engine (pools[0].engines[0]); the name comes from the URL, so set name',
    );
  });

  it('accepts colliding derived names once names are given', () => {
    const config = loadFile(`
pools:
  - name: a
    models: [x]
    engines: [{url: "http://vllm:8000", name: a}, {url: "https://vllm:8000", name: b}]
`);
    expect(config.pools[0]?.engines.map((e) => [e.name, e.url])).toEqual([
      ['a', 'http://vllm:8000'],
      ['b', 'https://vllm:8000'],
    ]);
  });
});
