// Whatever is written where the file takes a secret (an engine's or a pass-through's `apiKey`,
// a tenant's `apiKeys`), no error shows it: not as a string, a number, a list or a mapping, and
// not inside a larger value that an error does show.
import { describe, expect, it } from 'vitest';
import { fileError } from './helpers.js';

const SECRET = 'sk-live-S3CRET-4242';
const NUMBER = 98765432123;

const engineWith = (apiKey: string) =>
  `pools:\n  - name: p\n    models: [m]\n    engines:\n      - { url: "http://e:1", apiKey: ${apiKey} }\n`;
const passthroughWith = (apiKey: string) =>
  `passthrough:\n  - { model: e, url: "http://tei:8080", apiKey: ${apiKey} }\n`;
const tenantWith = (apiKeys: string) =>
  `pools: []\ntenants:\n  - { name: alpha, apiKeys: ${apiKeys} }\n`;

const chars = (text: string) => `(hidden, ${text.length} characters)`;
const BLANK = `"${SECRET} x"`; // a scalar that is no valid key: it has a blank

/** [where, shape, file, the path the error names, how it shows the value]. */
const cases: Array<[string, string, string, string, string]> = [
  ...(
    [
      ['pools[].engines[].apiKey', engineWith, 'pools[0].engines[0].apiKey'],
      ['passthrough[].apiKey', passthroughWith, 'passthrough[0].apiKey'],
    ] as const
  ).flatMap(([where, file, at]): Array<[string, string, string, string, string]> => [
    [where, 'a scalar', file(BLANK), at, chars(`${SECRET} x`)],
    [where, 'a number', file(String(NUMBER)), at, chars(String(NUMBER))],
    [where, 'a list', file(`[${SECRET}]`), at, '(hidden, a list)'],
    [where, 'a mapping', file(`{ prod: ${SECRET} }`), at, '(hidden, a mapping)'],
  ]),
  // apiKeys takes a list: one key written alone is the scalar case, and in a list of the
  // wrong things the item is what is refused.
  ['tenants[].apiKeys', 'a scalar', tenantWith(SECRET), 'tenants[0].apiKeys', chars(SECRET)],
  [
    'tenants[].apiKeys',
    'a number',
    tenantWith(String(NUMBER)),
    'tenants[0].apiKeys',
    chars(String(NUMBER)),
  ],
  [
    'tenants[].apiKeys',
    'a mapping',
    tenantWith(`{ prod: ${SECRET} }`),
    'tenants[0].apiKeys',
    '(hidden, a mapping)',
  ],
  [
    'tenants[].apiKeys',
    'a list in the list',
    tenantWith(`[[${SECRET}]]`),
    'tenants[0].apiKeys[0]',
    '(hidden, a list)',
  ],
  [
    'tenants[].apiKeys',
    'a mapping in the list',
    tenantWith(`[{ prod: ${SECRET} }]`),
    'tenants[0].apiKeys[0]',
    '(hidden, a mapping)',
  ],
  [
    'tenants[].apiKeys',
    'a number in the list',
    tenantWith(`[${NUMBER}]`),
    'tenants[0].apiKeys[0]',
    chars(String(NUMBER)),
  ],
  [
    'tenants[].apiKeys',
    'a bad scalar in the list',
    tenantWith(`[${BLANK}]`),
    'tenants[0].apiKeys[0]',
    chars(`${SECRET} x`),
  ],
];

describe('secrets in the file are never shown', () => {
  it.each(cases)('%s written as %s', (_place, _shape, yaml, at, shown) => {
    const error = fileError(yaml);
    expect(error.variable).toBe(at);
    expect(error.message.startsWith(`/etc/sluice.yaml: ${at}=${shown} is invalid: expected `)).toBe(
      true,
    );
    expect(error.message).not.toContain('S3CRET');
    expect(error.message).not.toContain(String(NUMBER));
  });

  it('says what was expected where a list of keys is not a list', () => {
    expect(fileError(tenantWith(SECRET)).message).toBe(
      `/etc/sluice.yaml: tenants[0].apiKeys=(hidden, ${SECRET.length} characters) is invalid: expected a list of keys`,
    );
    expect(fileError(tenantWith(`{ prod: ${SECRET} }`)).message).toBe(
      '/etc/sluice.yaml: tenants[0].apiKeys=(hidden, a mapping) is invalid: expected a list of keys',
    );
    expect(fileError(engineWith('~')).message).toBe(
      '/etc/sluice.yaml: pools[0].engines[0].apiKey=(hidden, empty) is invalid: expected a token of visible ASCII characters (no blanks or newlines)',
    );
  });

  it('hides a key inside a larger value that an error shows', () => {
    const tenantsNotAList = fileError(`tenants: { name: alpha, apiKeys: [${SECRET}] }\n`);
    expect(tenantsNotAList.variable).toBe('tenants');
    expect(tenantsNotAList.message).toBe(
      '/etc/sluice.yaml: tenants={"name":"alpha","apiKeys":"(hidden, a list)"} is invalid: expected a non-empty list of tenants',
    );
    const enginesNotAList = fileError(
      `pools:\n  - name: p\n    models: [m]\n    engines: { url: "http://e:1", apiKey: ${SECRET} }\n`,
    );
    expect(enginesNotAList.variable).toBe('pools[0].engines');
    expect(enginesNotAList.message).toContain(`"apiKey":"(hidden, ${SECRET.length} characters)"`);
    const engineInAList = fileError(
      `pools:\n  - name: p\n    models: [m]\n    engines: [[{ url: "http://e:1", apiKey: ${SECRET} }]]\n`,
    );
    expect(engineInAList.variable).toBe('pools[0].engines[0]');
    const passthroughNotAList = fileError(
      `passthrough: { model: e, url: "http://t:1", apiKey: ${NUMBER} }\n`,
    );
    for (const error of [tenantsNotAList, enginesNotAList, engineInAList, passthroughNotAList]) {
      expect(error.message).not.toContain('S3CRET');
      expect(error.message).not.toContain(String(NUMBER));
    }
  });

  it('masks credentials written into an engine or pass-through url', () => {
    const engine = fileError(engineWith('k').replace('http://e:1', `http://:${SECRET}@e:1`));
    expect(engine.variable).toBe('pools[0].engines[0].url');
    expect(engine.message).toBe(
      '/etc/sluice.yaml: pools[0].engines[0].url="http://***@e:1" is invalid: expected an http:// or https:// origin without path, credentials or query, e.g. http://vllm-0:8000',
    );
    const passthrough = fileError(
      passthroughWith('k').replace('http://tei:8080', `http://tei:8080?token=${SECRET}`),
    );
    expect(passthrough.variable).toBe('passthrough[0].url');
    expect(passthrough.message).toContain('passthrough[0].url="http://tei:8080?***" is invalid');
    const inside = fileError(
      `pools:\n  - name: p\n    models: [m]\n    engines: { url: "http://u:${SECRET}@e:1" }\n`,
    );
    expect(inside.message).toContain('{"url":"http://***@e:1"}');
    for (const error of [engine, passthrough, inside])
      expect(error.message).not.toContain('S3CRET');
  });
});
