// Each tenant's vLLM cache_salt: derived once from configuration clients do not have, and put
// into a body as its last member without parsing it, so that a parser keeping the last of
// duplicate names (Python's json, pydantic, JSON.parse) reads the tenant's salt whatever the
// client sent.
import { spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { keyDigest, type TenantConfig } from '@sluice/config';
import { peekRequest } from '@sluice/openai';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import {
  CACHE_SALT_FIELD,
  CacheSalts,
  cacheSaltsFor,
  saltMember,
  tenantCacheSalt,
  withCacheSalt,
} from '../src/cache-salt.ts';

const tenant = (name: string, ...keys: string[]): TenantConfig => ({
  name,
  keySha256: keys.map(keyDigest),
  weight: 1,
  maxPriority: 0,
});
const alpha = tenant('alpha', 'sk-alpha-1', 'sk-alpha-2');
const beta = tenant('beta', 'sk-beta-1');

const parse = (b: Buffer) => JSON.parse(b.toString('utf8')) as Record<string, unknown>;

describe('tenantCacheSalt', () => {
  it('is stable: the same tenant gives the same salt, whatever the order of its keys', () => {
    expect(tenantCacheSalt(alpha)).toBe(tenantCacheSalt({ ...alpha }));
    expect(tenantCacheSalt(alpha)).toBe(
      tenantCacheSalt({ ...alpha, keySha256: [...alpha.keySha256].reverse() }),
    );
    // Pinned: replicas of every version must agree, or a tenant's cache goes cold on upgrade.
    expect(tenantCacheSalt(beta)).toBe(
      createHash('sha256')
        .update(`sluice tenant cache_salt v1\0beta\0${keyDigest('sk-beta-1')}`)
        .digest('hex'),
    );
  });

  it('differs per tenant, and with the keys of a tenant of the same name', () => {
    const salts = [
      alpha,
      beta,
      tenant('gamma', 'sk-alpha-1'),
      tenant('alpha', 'sk-alpha-1'),
      tenant('alpha', 'sk-other'),
    ].map(tenantCacheSalt);
    expect(new Set(salts).size).toBe(salts.length);
  });

  it('cannot be worked out from the tenant name alone', () => {
    const salt = tenantCacheSalt(alpha);
    for (const guess of ['alpha', 'sluice tenant cache_salt v1\0alpha'])
      expect(createHash('sha256').update(guess).digest('hex')).not.toBe(salt);
    expect(tenantCacheSalt({ name: 'alpha', keySha256: [] })).not.toBe(salt);
  });

  it("is a value every vLLM takes: a non-empty string of at most 128 characters without '@', '/', '\\' or NUL", () => {
    fc.assert(
      fc.property(
        fc.stringMatching(/^[A-Za-z0-9_.-]{1,63}$/),
        fc.array(fc.string(), { minLength: 1, maxLength: 4 }),
        (name, keys) => {
          const salt = tenantCacheSalt(tenant(name, ...keys));
          expect(salt).toMatch(/^[0-9a-f]{64}$/);
        },
      ),
    );
  });
});

/** JSON text of `value` as clients write it: compact, indented, or with blanks around it. */
const jsonText = (value: unknown) =>
  fc
    .tuple(
      fc.constantFrom(undefined, 0, 1, 2, '\t'),
      fc.stringMatching(/^[ \t\r\n]{0,4}$/),
      fc.stringMatching(/^[ \t\r\n]{0,4}$/),
    )
    .map(([indent, lead, trail]) => `${lead}${JSON.stringify(value, null, indent)}${trail}`);

/** A request-like object: any members, maybe the client's own cache_salt of any type. */
const requestObject = fc
  .tuple(
    fc.dictionary(
      fc.string().filter((k) => k !== CACHE_SALT_FIELD && k !== '__proto__'),
      fc.jsonValue({ maxDepth: 2 }),
      { maxKeys: 6 },
    ),
    fc.option(fc.jsonValue({ maxDepth: 1 }), { nil: undefined }),
  )
  .map(([members, clientSalt]) =>
    clientSalt === undefined ? members : { ...members, [CACHE_SALT_FIELD]: clientSalt },
  );

/** What the peek reads of a body (its refusal's message for one it refuses), spans included. */
function peekFields(body: Buffer) {
  try {
    const { model, stream, maxTokens, maxCompletionTokens, n, prompts, messages, prompt } =
      peekRequest(body);
    return { model, stream, maxTokens, maxCompletionTokens, n, prompts, messages, prompt };
  } catch (err) {
    return (err as Error).message;
  }
}

describe('withCacheSalt', () => {
  const salt = tenantCacheSalt(alpha);
  const member = saltMember(salt);

  it("gives JSON that keeps every other member and whose cache_salt is the tenant's, whatever the client sent", () => {
    fc.assert(
      fc.property(
        requestObject.chain((obj) => fc.tuple(fc.constant(obj), jsonText(obj))),
        ([obj, text]) => {
          const body = Buffer.from(text, 'utf8');
          const out = withCacheSalt(body, member);
          const parsed = parse(out);
          expect(parsed[CACHE_SALT_FIELD]).toBe(salt);
          const { [CACHE_SALT_FIELD]: _salt, ...rest } = parsed;
          const { [CACHE_SALT_FIELD]: _sent, ...sent } = parse(body);
          expect(rest).toStrictEqual(sent);
          expect(Object.keys(rest)).toStrictEqual(
            Object.keys(obj).filter((k) => k !== CACHE_SALT_FIELD),
          );
          // Only the member was added, in front of the closing brace: the bytes around it stay.
          expect(out.length).toBe(body.length + member.length - (Object.keys(obj).length ? 0 : 1));
          const close = text.trimEnd().length - 1;
          expect(out.subarray(0, close).equals(body.subarray(0, close))).toBe(true);
          expect(
            out.subarray(out.length - (body.length - close)).equals(body.subarray(close)),
          ).toBe(true);
          // The gateway's own peek (and so the dispatcher's) reads the result as it read the body.
          expect(peekFields(out)).toStrictEqual(peekFields(body));
        },
      ),
    );
  });

  it('adds the salt without a comma to an empty object, blanks or not', () => {
    for (const text of ['{}', '{ }', '{}\n', ' \t{\r\n}\n ', '{\n\n}'])
      expect(parse(withCacheSalt(Buffer.from(text), member))).toStrictEqual({
        [CACHE_SALT_FIELD]: salt,
      });
    expect(withCacheSalt(Buffer.from('{}'), member).toString()).toBe(`{"cache_salt":"${salt}"}`);
  });

  it("puts it last, so the client's own is overridden wherever it stood", () => {
    const text = `{"cache_salt":"${tenantCacheSalt(beta)}","model":"m","cache_salt":"x" }\r\n`;
    const out = withCacheSalt(Buffer.from(text), member).toString();
    expect(out).toBe(
      `{"cache_salt":"${tenantCacheSalt(beta)}","model":"m","cache_salt":"x" ,"cache_salt":"${salt}"}\r\n`,
    );
    expect(parse(Buffer.from(out))[CACHE_SALT_FIELD]).toBe(salt);
  });

  // vLLM's FastAPI reads the body with Python's json.loads (Starlette's Request.json): checked
  // against the real one where this machine has a python3.
  const python = spawnSync('python3', ['--version']).status === 0;
  it.skipIf(!python)("is read with the tenant's salt by Python's json, as vLLM reads it", () => {
    const bodies = [
      '{}',
      '{"model":"m","cache_salt":"client"}',
      '{"cache_salt":"a", "messages":[{"role":"user","content":"}"}] ,"cache_salt":null}\n',
    ];
    const salted = bodies.map((b) => withCacheSalt(Buffer.from(b), member).toString());
    const read = spawnSync(
      'python3',
      [
        '-c',
        'import json, sys\nfor line in sys.stdin.read().split("\\0"): print(json.loads(line)["cache_salt"])',
      ],
      { input: salted.join('\0'), encoding: 'utf8' },
    );
    expect(read.stderr).toBe('');
    expect(read.stdout.trim().split('\n')).toStrictEqual(bodies.map(() => salt));
  });

  it('refuses what is not an object (the peek never lets one through)', () => {
    for (const text of ['', '   ', '[]', '"{}"', '{}x'])
      expect(() => withCacheSalt(Buffer.from(text), member)).toThrow(TypeError);
  });
});

describe('CacheSalts', () => {
  const salts = new CacheSalts([alpha, beta]);
  const body = Buffer.from('{"model":"m","prompt":"hi","cache_salt":"beta?"}');

  it("gives each tenant's requests its own salt", () => {
    expect(parse(salts.apply(body, alpha))[CACHE_SALT_FIELD]).toBe(tenantCacheSalt(alpha));
    expect(parse(salts.apply(body, beta))[CACHE_SALT_FIELD]).toBe(tenantCacheSalt(beta));
  });

  it('leaves a request without a tenant as it is', () => {
    expect(salts.apply(body, null)).toBe(body);
    expect(salts.apply(body, undefined)).toBe(body);
    expect(salts.apply(body, { name: 'unknown' })).toBe(body);
  });

  it('exists only with tenants and SLUICE_TENANT_CACHE_SALT on', () => {
    expect(cacheSaltsFor({ tenants: [alpha], tenantCacheSalt: true })).toBeInstanceOf(CacheSalts);
    expect(cacheSaltsFor({ tenants: [alpha], tenantCacheSalt: false })).toBeUndefined();
    expect(cacheSaltsFor({ tenantCacheSalt: true })).toBeUndefined();
  });
});
