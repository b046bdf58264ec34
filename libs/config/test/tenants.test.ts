// The YAML file's `tenants` list: keys hashed on load and never kept, strict validation.
import { createHash } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { keyDigest } from '../src/index.js';
import { fileError, loadFile } from './helpers.js';

const POOL = `
pools:
  - name: p
    models: [m]
    engines:
      - url: http://vllm-0:8000
`;
const sha = (key: string) => createHash('sha256').update(key).digest('hex');

describe('SLUICE_CONFIG: tenants', () => {
  it('reads tenants, hashes plain keys and keeps only digests, with defaults filled', () => {
    const config = loadFile(
      `${POOL}tenants:
  - name: alpha
    apiKeys: [sk-alpha-0001]
    weight: 2
    maxQueued: 20
    maxPriority: 3
  - name: beta.team_2
    apiKeySha256: [${sha('sk-beta-0001').toUpperCase()}]
`,
    );
    expect(config.tenants).toEqual([
      {
        name: 'alpha',
        keySha256: [sha('sk-alpha-0001')],
        weight: 2,
        maxQueued: 20,
        maxPriority: 3,
      },
      { name: 'beta.team_2', keySha256: [sha('sk-beta-0001')], weight: 1, maxPriority: 0 },
    ]);
    expect(JSON.stringify(config)).not.toContain('sk-alpha-0001');
    expect(keyDigest('sk-alpha-0001')).toBe(sha('sk-alpha-0001'));
  });

  it('has no tenants without the list, and reads pass-through keys', () => {
    expect(loadFile(POOL).tenants).toBeUndefined();
    const config = loadFile(
      'passthrough:\n  - model: e\n    url: http://tei:80\n    apiKey: tei-secret\n',
    );
    expect(config.passthrough).toEqual([{ model: 'e', url: 'http://tei', apiKey: 'tei-secret' }]);
  });

  it('refuses each mistake with one line naming the place, never showing a key', () => {
    const cases: Array<[string, RegExp]> = [
      ['tenants: []', /tenants is empty: remove it to serve without API keys/],
      ['tenants:\n  - name: a\n', /tenants\[0\] has no key/],
      ['tenants:\n  - apiKeys: [sk-aaaa-0001]\n', /tenants\[0\]\.name is missing/],
      [
        'tenants:\n  - name: "a b"\n    apiKeys: [sk-aaaa-0001]\n',
        /tenants\[0\]\.name="a b" is invalid/,
      ],
      [
        'tenants:\n  - name: a\n    apiKeys: [sk-aaaa-0001]\n  - name: a\n    apiKeys: [sk-bbbb-0001]\n',
        /tenants\[1\]\.name="a" is invalid: expected a name not used elsewhere \(already at tenants\[0\]\)/,
      ],
      [
        'tenants:\n  - name: a\n    apiKeys: [sk-aaaa-0001]\n  - name: b\n    apiKeys: [sk-aaaa-0001]\n',
        /tenants\[1\]\.apiKeys\[0\] is the same key as tenants\[0\]\.apiKeys\[0\]/,
      ],
      [
        `tenants:\n  - name: a\n    apiKeys: [sk-aaaa-0001]\n    apiKeySha256: [${sha('sk-aaaa-0001')}]\n`,
        /tenants\[0\]\.apiKeySha256\[0\] is the same key as tenants\[0\]\.apiKeys\[0\]/,
      ],
      [
        'tenants:\n  - name: a\n    apiKeys: [short]\n',
        /apiKeys\[0\]=\(hidden, 5 characters\) is invalid/,
      ],
      [
        'tenants:\n  - name: a\n    apiKeySha256: [abc]\n',
        /apiKeySha256\[0\]="abc" is invalid: expected a SHA-256 digest/,
      ],
      [
        'tenants:\n  - name: a\n    apiKeys: [sk-aaaa-0001]\n    weight: 0\n',
        /weight=0 is invalid: expected a number > 0/,
      ],
      [
        'tenants:\n  - name: a\n    apiKeys: [sk-aaaa-0001]\n    maxQueued: 0\n',
        /maxQueued=0 is invalid/,
      ],
      [
        'tenants:\n  - name: a\n    apiKeys: [sk-aaaa-0001]\n    maxPriority: 11\n',
        /maxPriority=11 is invalid: expected an integer from 0 to 10/,
      ],
      [
        'tenants:\n  - name: a\n    apiKeys: [sk-aaaa-0001]\n    quota: 1\n',
        /tenants\[0\]\.quota is not a known key/,
      ],
      [
        'tenants:\n  - name: a\n    apiKeys: []\n',
        /tenants\[0\]\.apiKeys=\[\] is invalid: expected a non-empty list/,
      ],
    ];
    for (const [yaml, message] of cases) {
      const error = fileError(`${POOL}${yaml}`, { SLUICE_MAX_PRIORITY: '10' });
      expect(error.message, yaml).toMatch(message);
      expect(error.message).not.toMatch(/sk-aaaa|sk-bbbb|short\b/);
    }
  });
});
