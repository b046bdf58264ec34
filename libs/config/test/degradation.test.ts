// Degradation settings: the shipped defaults, SLUICE_DEGRADATION, the `degradation:` blocks of
// the YAML file (top level and per pool), their errors, and the shipped example file.
import { readFileSync } from 'node:fs';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { stringify } from 'yaml';
import {
  ConfigError,
  defaultDegradation,
  loadConfig,
  type DegradationConfig,
  type DegradationProfile,
} from '../src/index.js';
import { envError, fileError, files, loadFile, type Env } from './helpers.js';

const EXAMPLE = new URL('../examples/degradation.yaml', import.meta.url);
const single = (env: Env = {}) => loadConfig({ VLLM_URL: 'http://e:1', ...env });

/** One pool `p` with an optional degradation block (YAML flow mapping) and top-level block. */
const file = (poolBlock?: string, topBlock?: string) =>
  `${topBlock === undefined ? '' : `degradation: ${topBlock}\n`}pools:
  - name: p
    models: [m]
    engines: [{url: "http://e:1"}]
${poolBlock === undefined ? '' : `    degradation: ${poolBlock}\n`}`;

const KEYS =
  'enabled, signal, alpha, hysteresis, minMaxTokens, defaultMaxTokens, systemPrompt, completionPrefix, allowOptOut, profiles';

describe('the shipped defaults', () => {
  it("are the reference article's three states", () => {
    expect(defaultDegradation).toStrictEqual({
      enabled: true,
      signal: ['kv'],
      alpha: 0.3,
      hysteresis: 0.05,
      minMaxTokens: 16,
      defaultMaxTokens: 1024,
      systemPrompt: 'prepend',
      completionPrefix: true,
      allowOptOut: false,
      profiles: [
        { name: 'normal', threshold: 0, maxTokensFactor: 1 },
        { name: 'tired', threshold: 0.75, instruction: 'Answer concisely.', maxTokensFactor: 0.7 },
        {
          name: 'lazy',
          threshold: 0.9,
          instruction: 'Provide extremely short answers only. No explanations. Code only if asked.',
          maxTokensFactor: 0.3,
        },
      ],
    });
  });

  it('are a valid profile list in which every state after the first does something', () => {
    const [first, ...rest] = defaultDegradation.profiles;
    expect(first).toStrictEqual({ name: 'normal', threshold: 0, maxTokensFactor: 1 });
    let previous = 0;
    for (const profile of rest) {
      expect(profile.threshold).toBeGreaterThan(previous);
      expect(profile.threshold).toBeGreaterThan(defaultDegradation.hysteresis);
      expect(profile.instruction).toBeTruthy();
      expect(profile.maxTokensFactor).toBeGreaterThan(0);
      expect(profile.maxTokensFactor).toBeLessThan(1);
      previous = profile.threshold;
    }
    const names = defaultDegradation.profiles.map((p) => p.name);
    expect(new Set(names).size).toBe(names.length);
  });

  it('are frozen all the way down', () => {
    expect(Object.isFrozen(defaultDegradation)).toBe(true);
    expect(Object.isFrozen(defaultDegradation.signal)).toBe(true);
    expect(Object.isFrozen(defaultDegradation.profiles)).toBe(true);
    expect(defaultDegradation.profiles.every((p) => Object.isFrozen(p))).toBe(true);
  });
});

describe('the VLLM_URL pool and SLUICE_DEGRADATION', () => {
  it('gets the defaults, as a copy of its own', () => {
    const pool = single().pools[0];
    expect(pool?.degradation).toStrictEqual({ ...defaultDegradation });
    expect(pool?.degradation).not.toBe(defaultDegradation);
    expect(pool?.degradation.profiles).not.toBe(defaultDegradation.profiles);
    expect(Object.isFrozen(pool?.degradation.profiles[1])).toBe(false);
  });

  it('leaves the GPU out of the default signal even with a GPU source (kernel time, not load)', () => {
    for (const source of ['nvml', 'mock', 'nvidia-smi'])
      expect(single({ GPU_SOURCE: source }).pools[0]?.degradation.signal).toEqual(['kv']);
    expect(
      single({ GPU_SOURCE: 'dcgm', DCGM_URL: 'http://d:9400/metrics' }).pools[0]?.degradation
        .signal,
    ).toEqual(['kv']);
  });

  it('is switched off by SLUICE_DEGRADATION=off and on by on (the default)', () => {
    expect(single({ SLUICE_DEGRADATION: 'off' }).pools[0]?.degradation).toStrictEqual({
      ...defaultDegradation,
      enabled: false,
    });
    expect(single({ SLUICE_DEGRADATION: 'on' }).pools[0]?.degradation.enabled).toBe(true);
    expect(single({ SLUICE_DEGRADATION: '' }).pools[0]?.degradation.enabled).toBe(true);
  });

  it('refuses anything but on or off', () => {
    const error = envError({ VLLM_URL: 'http://e:1', SLUICE_DEGRADATION: 'disabled' });
    expect(error.variable).toBe('SLUICE_DEGRADATION');
    expect(error.message).toBe('SLUICE_DEGRADATION="disabled" is invalid: expected one of on, off');
  });

  it('returns fresh settings on every load: changing one pool changes nothing else', () => {
    const a = single();
    const profile = a.pools[0]?.degradation.profiles[1] as DegradationProfile;
    profile.maxTokensFactor = 0.01;
    expect(single().pools[0]?.degradation.profiles[1]?.maxTokensFactor).toBe(0.7);
    expect(defaultDegradation.profiles[1]?.maxTokensFactor).toBe(0.7);
  });
});

describe('SLUICE_CONFIG: degradation blocks', () => {
  it('gives every pool the defaults when the file says nothing', () => {
    expect(loadFile(file()).pools[0]?.degradation).toStrictEqual({ ...defaultDegradation });
    expect(loadFile(file(), { GPU_SOURCE: 'mock' }).pools[0]?.degradation.signal).toEqual(['kv']);
  });

  it("reads the brief's example: top-level defaults for all pools, a pool switched off", () => {
    const config = loadFile(
      `
degradation:
  enabled: true
  signal: [kv, gpu]
  alpha: 0.3
  hysteresis: 0.05
  minMaxTokens: 16
  defaultMaxTokens: 1024
  systemPrompt: prepend
  completionPrefix: true
  allowOptOut: false
  profiles:
    - { name: normal, threshold: 0 }
    - { name: tired, threshold: 0.75, instruction: "Answer concisely.", maxTokensFactor: 0.7 }
    - { name: lazy,  threshold: 0.90, instruction: "Provide extremely short answers only. No explanations. Code only if asked.", maxTokensFactor: 0.3 }
pools:
  - name: reasoning
    models: [r1]
    engines: [{url: "http://a:1"}]
    degradation: { enabled: false }
  - name: chat
    models: [chat]
    engines: [{url: "http://b:1"}]
`,
      { GPU_SOURCE: 'nvml' },
    );
    const withGpu = { ...defaultDegradation, signal: ['kv', 'gpu'] };
    expect(config.pools.map((p) => p.degradation)).toStrictEqual([
      { ...withGpu, enabled: false },
      withGpu,
    ]);
  });

  it('layers: built-in defaults, then the top level, then the pool, field by field', () => {
    const degradation = loadFile(
      file(
        '{ alpha: 0.5, systemPrompt: APPEND, defaultMaxTokens: 256 }',
        '{ alpha: 0.2, hysteresis: 0.1, signal: [queue, kv], allowOptOut: true, completionPrefix: false, minMaxTokens: 1 }',
      ),
    ).pools[0]?.degradation;
    expect(degradation).toStrictEqual({
      ...defaultDegradation,
      signal: ['queue', 'kv'],
      alpha: 0.5,
      hysteresis: 0.1,
      minMaxTokens: 1,
      defaultMaxTokens: 256,
      systemPrompt: 'append',
      completionPrefix: false,
      allowOptOut: true,
    });
  });

  it('replaces the whole profile list; a profile without a factor keeps max_tokens (1)', () => {
    const profiles = `[{name: calm, threshold: 0}, {name: busy, threshold: 0.5, instruction: "Be brief.\\nNo lists."}, {name: on-fire, threshold: 0.95, maxTokensFactor: 0.1}]`;
    const top = loadFile(file(undefined, `{ profiles: ${profiles} }`)).pools[0]?.degradation;
    const pool = loadFile(file(`{ profiles: ${profiles} }`)).pools[0]?.degradation;
    const expected: DegradationProfile[] = [
      { name: 'calm', threshold: 0, maxTokensFactor: 1 },
      { name: 'busy', threshold: 0.5, instruction: 'Be brief.\nNo lists.', maxTokensFactor: 1 },
      { name: 'on-fire', threshold: 0.95, maxTokensFactor: 0.1 },
    ];
    expect(top?.profiles).toStrictEqual(expected);
    expect(pool?.profiles).toStrictEqual(expected);
  });

  it('accepts a single profile (degradation that never degrades) and any number of them', () => {
    expect(
      loadFile(file('{ profiles: [{name: only, threshold: 0}] }')).pools[0]?.degradation.profiles,
    ).toHaveLength(1);
    const many = Array.from({ length: 10 }, (_, i) => ({ name: `s${i}`, threshold: i / 10 }));
    expect(
      loadFile(file(`{ hysteresis: 0.05, profiles: ${JSON.stringify(many)} }`)).pools[0]
        ?.degradation.profiles,
    ).toHaveLength(10);
  });

  it('SLUICE_DEGRADATION=off switches every pool off, whatever the file says', () => {
    const config = loadFile(file('{ enabled: true }', '{ enabled: true }'), {
      SLUICE_DEGRADATION: 'off',
    });
    expect(config.pools[0]?.degradation.enabled).toBe(false);
    expect(loadFile(file('{ enabled: false }')).pools[0]?.degradation.enabled).toBe(false);
    expect(loadFile(file(undefined, '{ enabled: false }')).pools[0]?.degradation.enabled).toBe(
      false,
    );
  });

  it('accepts a top-level block in a file without pools', () => {
    expect(loadFile('degradation: { alpha: 0.5 }\n').pools).toEqual([]);
  });
});

describe('SLUICE_CONFIG: degradation errors name the file and the path', () => {
  it.each([
    [
      'a typo in a top-level key',
      file(undefined, '{ enable: false }'),
      'degradation.enable',
      `/etc/sluice.yaml: degradation.enable is not a known key: expected one of ${KEYS}`,
    ],
    [
      'a typo in a pool key',
      file('{ hysterisis: 0.1 }'),
      'pools[0].degradation.hysterisis',
      `/etc/sluice.yaml: pools[0].degradation.hysterisis is not a known key: expected one of ${KEYS}`,
    ],
    [
      'a block that is not a mapping',
      file('off'),
      'pools[0].degradation',
      `/etc/sluice.yaml: pools[0].degradation="off" is invalid: expected a mapping with keys ${KEYS}`,
    ],
    [
      'enabled written as yes',
      file('{ enabled: yes }'),
      'pools[0].degradation.enabled',
      '/etc/sluice.yaml: pools[0].degradation.enabled="yes" is invalid: expected true or false',
    ],
    [
      'alpha 0',
      file(undefined, '{ alpha: 0 }'),
      'degradation.alpha',
      '/etc/sluice.yaml: degradation.alpha=0 is invalid: expected a number > 0 and <= 1',
    ],
    [
      'alpha above 1',
      file('{ alpha: 1.5 }'),
      'pools[0].degradation.alpha',
      '/etc/sluice.yaml: pools[0].degradation.alpha=1.5 is invalid: expected a number > 0 and <= 1',
    ],
    [
      'a negative hysteresis',
      file('{ hysteresis: -0.1 }'),
      'pools[0].degradation.hysteresis',
      '/etc/sluice.yaml: pools[0].degradation.hysteresis=-0.1 is invalid: expected a number from 0 to 1',
    ],
    [
      'a hysteresis no state could be left with',
      file(undefined, '{ hysteresis: 0.75 }'),
      'degradation.hysteresis',
      '/etc/sluice.yaml: degradation.hysteresis=0.75 is invalid: expected a number below the lowest threshold above 0 (0.75, a default), or that state could never be left',
    ],
    [
      'a hysteresis at or above the lowest threshold of the same file',
      file('{ hysteresis: 0.3, profiles: [{name: a, threshold: 0}, {name: b, threshold: 0.2}] }'),
      'pools[0].degradation.hysteresis',
      '/etc/sluice.yaml: pools[0].degradation.hysteresis=0.3 is invalid: expected a number below the lowest threshold above 0 (0.2 at pools[0].degradation.profiles[1].threshold), or that state could never be left',
    ],
    [
      'a lowest threshold at or below the default hysteresis',
      file('{ profiles: [{name: a, threshold: 0}, {name: b, threshold: 0.05}] }'),
      'pools[0].degradation.profiles[1].threshold',
      '/etc/sluice.yaml: pools[0].degradation.profiles[1].threshold=0.05 is invalid: expected a number above the hysteresis (0.05, a default), or this state could never be left',
    ],
    [
      'a pool hysteresis that clashes with top-level profiles',
      file(
        '{ hysteresis: 0.5 }',
        '{ profiles: [{name: a, threshold: 0}, {name: b, threshold: 0.4}] }',
      ),
      'pools[0].degradation.hysteresis',
      '/etc/sluice.yaml: pools[0].degradation.hysteresis=0.5 is invalid: expected a number below the lowest threshold above 0 (0.4 at degradation.profiles[1].threshold), or that state could never be left',
    ],
    [
      'a fractional minMaxTokens',
      file('{ minMaxTokens: 16.5 }'),
      'pools[0].degradation.minMaxTokens',
      '/etc/sluice.yaml: pools[0].degradation.minMaxTokens=16.5 is invalid: expected an integer >= 1',
    ],
    [
      'a defaultMaxTokens written as a string',
      file('{ defaultMaxTokens: "1024" }'),
      'pools[0].degradation.defaultMaxTokens',
      '/etc/sluice.yaml: pools[0].degradation.defaultMaxTokens="1024" is invalid: expected an integer >= 1',
    ],
    [
      'an unknown systemPrompt mode',
      file('{ systemPrompt: replace }'),
      'pools[0].degradation.systemPrompt',
      '/etc/sluice.yaml: pools[0].degradation.systemPrompt="replace" is invalid: expected one of prepend, append',
    ],
    [
      'completionPrefix written as a string',
      file('{ completionPrefix: "Be brief." }'),
      'pools[0].degradation.completionPrefix',
      '/etc/sluice.yaml: pools[0].degradation.completionPrefix="Be brief." is invalid: expected true or false',
    ],
    [
      'an empty signal list',
      file('{ signal: [] }'),
      'pools[0].degradation.signal',
      '/etc/sluice.yaml: pools[0].degradation.signal=[] is invalid: expected a non-empty list of signal sources (kv, gpu, queue)',
    ],
    [
      'a signal written as a word',
      file('{ signal: kv }'),
      'pools[0].degradation.signal',
      '/etc/sluice.yaml: pools[0].degradation.signal="kv" is invalid: expected a non-empty list of signal sources (kv, gpu, queue)',
    ],
    [
      'an unknown signal source',
      file('{ signal: [kv, cpu] }'),
      'pools[0].degradation.signal[1]',
      '/etc/sluice.yaml: pools[0].degradation.signal[1]="cpu" is invalid: expected one of kv, gpu, queue',
    ],
    [
      'a signal source listed twice',
      file('{ signal: [kv, queue, KV] }'),
      'pools[0].degradation.signal[2]',
      '/etc/sluice.yaml: pools[0].degradation.signal[2]="KV" is invalid: expected a source not listed twice',
    ],
    [
      'the GPU as a signal without a GPU source',
      file(undefined, '{ signal: [kv, gpu] }'),
      'degradation.signal',
      '/etc/sluice.yaml: degradation.signal=["kv","gpu"] is invalid: expected sources that are read: gpu needs GPU_SOURCE, which is none',
    ],
    [
      'an empty profile list',
      file('{ profiles: [] }'),
      'pools[0].degradation.profiles',
      '/etc/sluice.yaml: pools[0].degradation.profiles=[] is invalid: expected a non-empty list of profiles',
    ],
    [
      'a first profile above 0',
      file('{ profiles: [{name: a, threshold: 0.1}] }'),
      'pools[0].degradation.profiles[0].threshold',
      '/etc/sluice.yaml: pools[0].degradation.profiles[0].threshold=0.1 is invalid: expected 0: the first profile is the state under no load',
    ],
    [
      'thresholds out of order',
      file(
        '{ profiles: [{name: a, threshold: 0}, {name: b, threshold: 0.9}, {name: c, threshold: 0.75}] }',
      ),
      'pools[0].degradation.profiles[2].threshold',
      "/etc/sluice.yaml: pools[0].degradation.profiles[2].threshold=0.75 is invalid: expected a number above the previous profile's threshold (0.9) and at most 1",
    ],
    [
      'two profiles at one threshold',
      file(
        '{ profiles: [{name: a, threshold: 0}, {name: b, threshold: 0.8}, {name: c, threshold: 0.8}] }',
      ),
      'pools[0].degradation.profiles[2].threshold',
      "/etc/sluice.yaml: pools[0].degradation.profiles[2].threshold=0.8 is invalid: expected a number above the previous profile's threshold (0.8) and at most 1",
    ],
    [
      'a threshold above 1',
      file('{ profiles: [{name: a, threshold: 0}, {name: b, threshold: 75}] }'),
      'pools[0].degradation.profiles[1].threshold',
      '/etc/sluice.yaml: pools[0].degradation.profiles[1].threshold=75 is invalid: expected a number from 0 to 1',
    ],
    [
      'a missing threshold',
      file('{ profiles: [{name: a}] }'),
      'pools[0].degradation.profiles[0].threshold',
      '/etc/sluice.yaml: pools[0].degradation.profiles[0].threshold is missing: expected a number from 0 to 1',
    ],
    [
      'a missing name',
      file('{ profiles: [{threshold: 0}] }'),
      'pools[0].degradation.profiles[0].name',
      "/etc/sluice.yaml: pools[0].degradation.profiles[0].name is missing: expected 1 to 32 lower-case letters, digits, '_' or '-', starting with a letter or digit",
    ],
    [
      'a name that is not a label',
      file('{ profiles: [{name: Very Tired, threshold: 0}] }'),
      'pools[0].degradation.profiles[0].name',
      `/etc/sluice.yaml: pools[0].degradation.profiles[0].name="Very Tired" is invalid: expected 1 to 32 lower-case letters, digits, '_' or '-', starting with a letter or digit`,
    ],
    [
      'two profiles with one name',
      file('{ profiles: [{name: a, threshold: 0}, {name: a, threshold: 0.5}] }'),
      'pools[0].degradation.profiles[1].name',
      '/etc/sluice.yaml: pools[0].degradation.profiles[1].name="a" is invalid: expected a name not used by another profile (pools[0].degradation.profiles[0])',
    ],
    [
      'a factor of 0',
      file('{ profiles: [{name: a, threshold: 0, maxTokensFactor: 0}] }'),
      'pools[0].degradation.profiles[0].maxTokensFactor',
      '/etc/sluice.yaml: pools[0].degradation.profiles[0].maxTokensFactor=0 is invalid: expected a number > 0 and <= 1',
    ],
    [
      'a factor above 1',
      file('{ profiles: [{name: a, threshold: 0, maxTokensFactor: 1.5}] }'),
      'pools[0].degradation.profiles[0].maxTokensFactor',
      '/etc/sluice.yaml: pools[0].degradation.profiles[0].maxTokensFactor=1.5 is invalid: expected a number > 0 and <= 1',
    ],
    [
      'a blank instruction',
      file('{ profiles: [{name: a, threshold: 0, instruction: "  "}] }'),
      'pools[0].degradation.profiles[0].instruction',
      '/etc/sluice.yaml: pools[0].degradation.profiles[0].instruction="  " is invalid: expected a non-blank text without control characters other than tab and newline',
    ],
    [
      'an instruction with a control character',
      file('{ profiles: [{name: a, threshold: 0, instruction: "be\\u0007brief"}] }'),
      'pools[0].degradation.profiles[0].instruction',
      '/etc/sluice.yaml: pools[0].degradation.profiles[0].instruction="be\\u0007brief" is invalid: expected a non-blank text without control characters other than tab and newline',
    ],
    [
      'a typo in a profile key',
      file('{ profiles: [{name: a, threshold: 0, maxTokenFactor: 0.5}] }'),
      'pools[0].degradation.profiles[0].maxTokenFactor',
      '/etc/sluice.yaml: pools[0].degradation.profiles[0].maxTokenFactor is not a known key: expected one of name, threshold, instruction, maxTokensFactor',
    ],
    [
      'a profile that is a bare name',
      file('{ profiles: [normal] }'),
      'pools[0].degradation.profiles[0]',
      '/etc/sluice.yaml: pools[0].degradation.profiles[0]="normal" is invalid: expected a mapping with keys name, threshold, instruction, maxTokensFactor',
    ],
  ])('%s', (_what, yaml, variable, message) => {
    const error = fileError(yaml);
    expect(error.variable).toBe(variable);
    expect(error.message).toBe(message);
  });

  it('accepts the GPU as a signal once a GPU source is configured', () => {
    expect(
      loadFile(file(undefined, '{ signal: [gpu] }'), { GPU_SOURCE: 'mock' }).pools[0]?.degradation
        .signal,
    ).toEqual(['gpu']);
  });

  it('checks the top-level block even when no pool uses it', () => {
    expect(fileError('degradation: { signal: [gpu] }\n').variable).toBe('degradation.signal');
  });
});

describe('the shipped example (examples/degradation.yaml)', () => {
  const text = readFileSync(EXAMPLE, 'utf8');
  const load = (env: Env = {}) =>
    loadConfig({ SLUICE_CONFIG: 'degradation.yaml', ...env }, files({ 'degradation.yaml': text }));

  it('loads, and spells out exactly the shipped defaults', () => {
    const [chat, reasoning] = load().pools;
    expect(chat?.degradation).toStrictEqual({ ...defaultDegradation });
    expect(reasoning?.degradation).toStrictEqual({ ...defaultDegradation, enabled: false });
  });

  it('reads the KV cache only, a GPU source configured or not', () => {
    expect(load({ GPU_SOURCE: 'mock' }).pools[0]?.degradation.signal).toEqual(['kv']);
  });
});

describe('properties of degradation blocks', () => {
  const profileList = fc
    .uniqueArray(fc.integer({ min: 60, max: 1000 }), { maxLength: 6 })
    .map((thousandths) =>
      [0, ...thousandths.sort((a, b) => a - b)].map((t, i): DegradationProfile => ({
        name: `state-${i}`,
        threshold: t / 1000,
        ...(i > 0 ? { instruction: `Be brief (${i}).` } : {}),
        maxTokensFactor: i === 0 ? 1 : Math.max(0.01, 1 - i / 7),
      })),
    );
  const block = fc.record(
    {
      enabled: fc.boolean(),
      signal: fc.subarray(['kv', 'queue'] as const, { minLength: 1 }),
      alpha: fc.double({ min: 0.01, max: 1, noNaN: true }),
      hysteresis: fc.double({ min: 0, max: 0.01, noNaN: true }),
      minMaxTokens: fc.integer({ min: 1, max: 64 }),
      defaultMaxTokens: fc.integer({ min: 1, max: 65536 }),
      systemPrompt: fc.constantFrom('prepend' as const, 'append' as const),
      completionPrefix: fc.boolean(),
      allowOptOut: fc.boolean(),
      profiles: profileList,
    },
    { requiredKeys: [] },
  );

  it('any valid block, on either level, round-trips onto the pool over the defaults', () => {
    fc.assert(
      fc.property(block, fc.boolean(), (written, atTop) => {
        const pool = { name: 'p', models: ['m'], engines: [{ url: 'http://e:1' }] };
        const doc = atTop
          ? { degradation: written, pools: [pool] }
          : { pools: [{ ...pool, degradation: written }] };
        const expected: DegradationConfig = { ...defaultDegradation, ...written };
        expect(loadFile(stringify(doc)).pools[0]?.degradation).toStrictEqual(expected);
      }),
      { numRuns: 200 },
    );
  });

  it('any block either loads or throws one line naming the file and a path inside degradation', () => {
    const loose = fc.oneof(
      fc.jsonValue({ maxDepth: 2 }),
      fc.constantFrom(0, 0.05, 0.75, 1, 1.5, -1, 'kv', 'gpu', 'prepend', true, null, [], {}),
    );
    const profile = fc.dictionary(
      fc.constantFrom('name', 'threshold', 'instruction', 'maxTokensFactor', 'x'),
      loose,
    );
    const fuzzed = fc.dictionary(
      fc.constantFrom(
        'enabled',
        'signal',
        'alpha',
        'hysteresis',
        'minMaxTokens',
        'defaultMaxTokens',
        'systemPrompt',
        'completionPrefix',
        'allowOptOut',
        'profiles',
        'other',
      ),
      fc.oneof(loose, fc.array(profile, { maxLength: 4 }), fc.array(loose, { maxLength: 3 })),
    );
    fc.assert(
      fc.property(fc.oneof(fuzzed, loose), fc.oneof(fuzzed, loose), (top, own) => {
        const doc = {
          degradation: top,
          pools: [{ name: 'p', models: ['m'], engines: [{ url: 'http://e:1' }], degradation: own }],
        };
        let error: unknown;
        try {
          loadFile(stringify(doc));
        } catch (caught) {
          error = caught;
        }
        if (error === undefined) return;
        expect(error).toBeInstanceOf(ConfigError);
        const { message, variable } = error as ConfigError;
        expect(message).toMatch(/^\/etc\/sluice\.yaml: [^\r\n\u2028\u2029]*$/);
        expect(variable).toMatch(/^(pools\[0\]\.)?degradation(\.|\[|$)/);
      }),
      { numRuns: 400 },
    );
  });

  it('a profile list whose thresholds do not strictly ascend from 0 is refused at a threshold', () => {
    const thresholds = fc
      .array(fc.constantFrom(0, 0.2, 0.5, 0.75, 0.9, 1), { minLength: 1, maxLength: 6 })
      .filter((ts) => ts[0] !== 0 || ts.some((t, i) => i > 0 && !(t > (ts[i - 1] as number))));
    fc.assert(
      fc.property(thresholds, (ts) => {
        const profiles = ts.map((threshold, i) => ({ name: `s${i}`, threshold }));
        const error = fileError(
          stringify({
            pools: [
              {
                name: 'p',
                models: ['m'],
                engines: [{ url: 'http://e:1' }],
                degradation: { profiles },
              },
            ],
          }),
        );
        expect(error.variable).toMatch(/^pools\[0\]\.degradation\.profiles\[\d+\]\.threshold$/);
      }),
    );
  });
});
