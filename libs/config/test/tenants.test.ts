// The YAML file's `tenants` list, pass-through `apiKey`, and GATEWAY_METRICS_PORT.
import { createHash } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { createRouter, loadConfig, MIN_TENANT_KEY_LENGTH } from '../src/index.js';
import { configError, envError, fileError, loadFile } from './helpers.js';

const sha = (key: string) => createHash('sha256').update(key).digest('hex');
const ALPHA_KEY = 'sk-alpha-0123456789abcdef0123456789';
const BETA_DIGEST = sha('sk-beta-abcdef');

/** A minimal valid file plus a `tenants:` block (given as YAML lines). */
const withTenants = (...lines: string[]) =>
  [
    'pools:',
    '  - { name: p, models: [m], engines: [{ url: "http://e:1" }] }',
    'tenants:',
    ...lines,
    '',
  ].join('\n');

describe('SLUICE_CONFIG: tenants', () => {
  it('reads tenants, hashing plain keys and keeping digests lower-case', () => {
    const config = loadFile(
      withTenants(
        '  - name: alpha',
        `    apiKeys: [${ALPHA_KEY}]`,
        '    weight: 2',
        '    maxQueued: 5',
        '    maxPriority: 5',
        '  - name: beta.team_2',
        `    apiKeySha256: [${BETA_DIGEST.toUpperCase()}]`,
        `    apiKeys: [sk-beta-second-0123456789abcdef0123]`,
      ),
    );
    expect(config.tenants).toEqual([
      { name: 'alpha', keySha256: [sha(ALPHA_KEY)], weight: 2, maxQueued: 5, maxPriority: 5 },
      {
        name: 'beta.team_2',
        keySha256: [sha('sk-beta-second-0123456789abcdef0123'), BETA_DIGEST],
        weight: 1,
        // Without its own: one below the pool's depth (VLLM_MAX_QUEUE_DEPTH's 8), see
        // tenant-queue-bound.test.ts.
        maxQueued: 7,
        maxPriority: 0,
      },
    ]);
    // The plain key is gone from the loaded config.
    expect(JSON.stringify(config)).not.toContain(ALPHA_KEY);
  });

  it('has no tenants when the key is absent, and none without a file', () => {
    expect(loadFile('pools: []\n')).not.toHaveProperty('tenants');
    expect(loadConfig({})).not.toHaveProperty('tenants');
  });

  it('allows maxPriority up to SLUICE_MAX_PRIORITY, not above', () => {
    const file = withTenants(
      '  - { name: a, apiKeys: [sk-test-k1-0123456789abcdef012345678], maxPriority: 50 }',
    );
    expect(loadFile(file, { SLUICE_MAX_PRIORITY: '50' }).tenants![0]!.maxPriority).toBe(50);
    const error = fileError(file);
    expect(error.variable).toBe('tenants[0].maxPriority');
    expect(error.message).toBe(
      '/etc/sluice.yaml: tenants[0].maxPriority=50 is invalid: expected an integer from 0 to 10 (SLUICE_MAX_PRIORITY)',
    );
  });

  it.each([
    [
      'an empty list',
      'pools: []\ntenants: []\n',
      'tenants',
      '/etc/sluice.yaml: tenants=[] is invalid: expected a non-empty list of tenants (remove the key to run without tenants)',
    ],
    [
      'a tenant without keys',
      withTenants('  - { name: a }'),
      'tenants[0]',
      '/etc/sluice.yaml: tenants[0] has no key: expected apiKeys or apiKeySha256 with at least one entry',
    ],
    [
      'a tenant with empty key lists',
      withTenants('  - { name: a, apiKeys: [], apiKeySha256: [] }'),
      'tenants[0]',
      '/etc/sluice.yaml: tenants[0] has no key: expected apiKeys or apiKeySha256 with at least one entry',
    ],
    [
      'a missing name',
      withTenants('  - { apiKeys: [sk-test-k-0123456789abcdef0123456789] }'),
      'tenants[0].name',
      "/etc/sluice.yaml: tenants[0].name is missing: expected 1 to 63 letters, digits, '_', '.' or '-'",
    ],
    [
      'a bad name',
      withTenants('  - { name: "team a", apiKeys: [sk-test-k-0123456789abcdef0123456789] }'),
      'tenants[0].name',
      `/etc/sluice.yaml: tenants[0].name="team a" is invalid: expected 1 to 63 letters, digits, '_', '.' or '-'`,
    ],
    [
      'a duplicate name',
      withTenants(
        '  - { name: a, apiKeys: [sk-test-k1-0123456789abcdef012345678] }',
        '  - { name: a, apiKeys: [sk-test-k2-0123456789abcdef012345678] }',
      ),
      'tenants[1].name',
      '/etc/sluice.yaml: tenants[1].name="a" is invalid: expected a name not used by another tenant (tenants[0])',
    ],
    [
      'an unknown key',
      withTenants(
        '  - { name: a, apiKeys: [sk-test-k-0123456789abcdef0123456789], apikeys: [sk-test-k2-0123456789abcdef012345678] }',
      ),
      'tenants[0].apikeys',
      '/etc/sluice.yaml: tenants[0].apikeys is not a known key: expected one of name, apiKeys, apiKeySha256, weight, maxQueued, maxPriority',
    ],
    [
      'a digest that is not 64 hex digits',
      withTenants('  - { name: a, apiKeySha256: [abc123] }'),
      'tenants[0].apiKeySha256[0]',
      '/etc/sluice.yaml: tenants[0].apiKeySha256[0]="abc123" is invalid: expected 64 hexadecimal digits (printf %s "$KEY" | sha256sum)',
    ],
    [
      'the same digest in two tenants',
      withTenants(
        `  - { name: a, apiKeySha256: [${BETA_DIGEST}] }`,
        `  - { name: b, apiKeySha256: [${BETA_DIGEST}] }`,
      ),
      'tenants[1].apiKeySha256[0]',
      `/etc/sluice.yaml: tenants[1].apiKeySha256[0]="${BETA_DIGEST}" is invalid: expected a key no other entry has (already at tenants[0].apiKeySha256[0])`,
    ],
    [
      'a weight of 0',
      withTenants('  - { name: a, apiKeys: [sk-test-k-0123456789abcdef0123456789], weight: 0 }'),
      'tenants[0].weight',
      '/etc/sluice.yaml: tenants[0].weight=0 is invalid: expected a number > 0',
    ],
    [
      'a fractional maxQueued',
      withTenants(
        '  - { name: a, apiKeys: [sk-test-k-0123456789abcdef0123456789], maxQueued: 1.5 }',
      ),
      'tenants[0].maxQueued',
      '/etc/sluice.yaml: tenants[0].maxQueued=1.5 is invalid: expected an integer >= 1',
    ],
    [
      'a maxQueued of 0',
      withTenants('  - { name: a, apiKeys: [sk-test-k-0123456789abcdef0123456789], maxQueued: 0 }'),
      'tenants[0].maxQueued',
      '/etc/sluice.yaml: tenants[0].maxQueued=0 is invalid: expected an integer >= 1',
    ],
    [
      'a negative maxPriority',
      withTenants(
        '  - { name: a, apiKeys: [sk-test-k-0123456789abcdef0123456789], maxPriority: -1 }',
      ),
      'tenants[0].maxPriority',
      '/etc/sluice.yaml: tenants[0].maxPriority=-1 is invalid: expected an integer from 0 to 10 (SLUICE_MAX_PRIORITY)',
    ],
    [
      'tenants that are not a list',
      'tenants: { name: a }\n',
      'tenants',
      '/etc/sluice.yaml: tenants={"name":"a"} is invalid: expected a non-empty list of tenants',
    ],
  ])('refuses %s', (_what, yaml, variable, message) => {
    const error = fileError(yaml);
    expect(error.variable).toBe(variable);
    expect(error.message).toBe(message);
  });

  it('never shows a plain key: a duplicate, one with blanks, one written as a number', () => {
    const duplicate = fileError(
      withTenants(
        `  - { name: a, apiKeys: [${ALPHA_KEY}] }`,
        `  - { name: b, apiKeys: [${ALPHA_KEY}] }`,
      ),
    );
    expect(duplicate.variable).toBe('tenants[1].apiKeys[0]');
    expect(duplicate.message).toBe(
      `/etc/sluice.yaml: tenants[1].apiKeys[0]=(hidden, ${ALPHA_KEY.length} characters) is invalid: expected a key no other entry has (already at tenants[0].apiKeys[0])`,
    );
    // A plain key and its own digest are the same key.
    const sameKey = fileError(
      withTenants(`  - { name: a, apiKeys: [${ALPHA_KEY}], apiKeySha256: [${sha(ALPHA_KEY)}] }`),
    );
    expect(sameKey.variable).toBe('tenants[0].apiKeySha256[0]');

    const blanks = fileError(withTenants('  - { name: a, apiKeys: ["sk secret key"] }'));
    expect(blanks.message).toBe(
      '/etc/sluice.yaml: tenants[0].apiKeys[0]=(hidden, 13 characters) is invalid: expected a token of visible ASCII characters (no blanks or newlines)',
    );
    const number = fileError(withTenants('  - { name: a, apiKeys: [1234567890] }'));
    expect(number.message).toContain('apiKeys[0]=(hidden, 10 characters) is invalid');
    for (const error of [duplicate, blanks, number]) {
      expect(error.message).not.toContain(ALPHA_KEY);
      expect(error.message).not.toContain('secret');
      expect(error.message).not.toContain('1234567890');
    }
  });
});

describe('SLUICE_CONFIG: a plain tenant key too short to be a credential', () => {
  const LONG_ENOUGH =
    'expected a key of at least 32 characters, random (e.g. sk-$(openssl rand -hex 24)): a short key can be guessed';

  it.each(['a', 'test', 'sk-alpha', 'x'.repeat(31)])(
    'refuses %j at load, naming where it is and its length, never the key',
    (key) => {
      const error = fileError(
        withTenants(
          `  - { name: a, apiKeys: [${ALPHA_KEY}] }`,
          `  - { name: b, apiKeys: [${'y'.repeat(40)}, ${key}] }`,
        ),
      );
      expect(error.variable).toBe('tenants[1].apiKeys[1]');
      expect(error.message).toBe(
        `/etc/sluice.yaml: tenants[1].apiKeys[1]=(hidden, ${key.length} characters) is invalid: ${LONG_ENOUGH}`,
      );
      expect(error.message).not.toContain(`=${key}`);
      expect(error.message).not.toContain(`"${key}"`);
    },
  );

  it('accepts 32 characters, MIN_TENANT_KEY_LENGTH', () => {
    expect(MIN_TENANT_KEY_LENGTH).toBe(32);
    const key = 'k'.repeat(MIN_TENANT_KEY_LENGTH);
    expect(
      loadFile(withTenants(`  - { name: a, apiKeys: [${key}] }`)).tenants![0]!.keySha256,
    ).toEqual([sha(key)]);
  });

  it('cannot check a digest: the key behind it is unknown, so any well-formed digest loads', () => {
    const weak = sha('test');
    expect(
      loadFile(withTenants(`  - { name: a, apiKeySha256: [${weak}] }`)).tenants![0]!.keySha256,
    ).toEqual([weak]);
  });
});

describe('SLUICE_CONFIG: a pass-through apiKey', () => {
  it('is read, and never shown when bad', () => {
    const file = (key: string) =>
      `passthrough:\n  - { model: e, url: "http://tei:8080", apiKey: ${key} }\n`;
    expect(loadFile(file('sk-tei-1')).passthrough).toEqual([
      { model: 'e', url: 'http://tei:8080', apiKey: 'sk-tei-1' },
    ]);
    expect(
      loadFile('passthrough:\n  - { model: e, url: "http://tei:8080" }\n').passthrough[0],
    ).not.toHaveProperty('apiKey');
    // The route carries it to the gateway's pass-through.
    expect(createRouter(loadFile(file('sk-tei-1'))).route('e')).toEqual({
      kind: 'passthrough',
      url: 'http://tei:8080',
      apiKey: 'sk-tei-1',
    });
    const error = fileError(file('"tei secret"'));
    expect(error.message).toBe(
      '/etc/sluice.yaml: passthrough[0].apiKey=(hidden, 10 characters) is invalid: expected a token of visible ASCII characters (no blanks or newlines)',
    );
  });
});

describe('GATEWAY_METRICS_PORT', () => {
  it('is unset by default', () => {
    expect(loadConfig({}).http).not.toHaveProperty('gatewayMetricsPort');
  });

  it('must differ from PORT, naming both', () => {
    const error = envError({ GATEWAY_METRICS_PORT: '8080' });
    expect(error.variable).toBe('GATEWAY_METRICS_PORT');
    expect(error.message).toBe(
      'GATEWAY_METRICS_PORT="8080" is invalid: expected a port other than PORT (8080)',
    );
    expect(
      configError(() => loadConfig({ PORT: '9000', GATEWAY_METRICS_PORT: '9000' })).message,
    ).toBe('GATEWAY_METRICS_PORT="9000" is invalid: expected a port other than PORT (9000)');
  });

  it('may be 0 (a free port) even when PORT is 0', () => {
    expect(loadConfig({ PORT: '0', GATEWAY_METRICS_PORT: '0' }).http).toMatchObject({
      port: 0,
      gatewayMetricsPort: 0,
    });
  });
});
