import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { peekRequest, RequestPeekError } from '../src/index.js';
import { requestMembers, serialize, style } from './arbitraries.js';
import { bytes, checkAgainstOracle } from './helpers.js';

type Mutation =
  | { readonly op: 'truncate'; readonly at: number }
  | { readonly op: 'set'; readonly at: number; readonly byte: number }
  | { readonly op: 'insert'; readonly at: number; readonly data: Uint8Array }
  | { readonly op: 'delete'; readonly at: number; readonly length: number };

const interesting = fc.oneof(
  fc.integer({ min: 0, max: 255 }),
  fc.constantFrom(0x22, 0x5c, 0x7b, 0x7d, 0x5b, 0x5d, 0x2c, 0x3a, 0x00, 0x0a, 0x20, 0xef, 0x80),
);

const mutation: fc.Arbitrary<Mutation> = fc.oneof(
  fc.record({ op: fc.constant('truncate' as const), at: fc.nat() }),
  fc.record({ op: fc.constant('set' as const), at: fc.nat(), byte: interesting }),
  fc.record({
    op: fc.constant('insert' as const),
    at: fc.nat(),
    data: fc.oneof(
      fc.uint8Array({ minLength: 1, maxLength: 4 }),
      fc.constantFrom('"', '\\', '\\u', '[', '{', '}', ',', ':1', 'null', '\u00e9').map(bytes),
    ),
  }),
  fc.record({
    op: fc.constant('delete' as const),
    at: fc.nat(),
    length: fc.integer({ min: 1, max: 4 }),
  }),
);

function mutate(body: Uint8Array, m: Mutation): Uint8Array {
  const at = body.length === 0 ? 0 : m.at % (body.length + 1);
  switch (m.op) {
    case 'truncate':
      return body.subarray(0, at);
    case 'set': {
      if (body.length === 0) return body;
      const copy = body.slice();
      copy[at % body.length] = m.byte;
      return copy;
    }
    case 'insert': {
      const out = new Uint8Array(body.length + m.data.length);
      out.set(body.subarray(0, at));
      out.set(m.data, at);
      out.set(body.subarray(at), at + m.data.length);
      return out;
    }
    case 'delete': {
      const end = Math.min(body.length, at + m.length);
      const out = new Uint8Array(body.length - (end - at));
      out.set(body.subarray(0, at));
      out.set(body.subarray(end), at);
      return out;
    }
  }
}

describe('fuzz: mutated request bodies', () => {
  it('give RequestPeekError or a result, and agree with JSON.parse', () => {
    const outcomes = { ok: 0, json: 0, field: 0 };
    fc.assert(
      fc.property(
        requestMembers,
        style,
        fc.array(mutation, { minLength: 1, maxLength: 4 }),
        (members, s, mutations) => {
          let body: Uint8Array = bytes(serialize(members, s));
          for (const m of mutations) body = mutate(body, m);
          const result = checkAgainstOracle(body);
          if (!(result instanceof RequestPeekError)) outcomes.ok++;
          else if (result.code === 'ERR_JSON') outcomes.json++;
          else outcomes.field++;
        },
      ),
      { numRuns: 5000 },
    );
    // Mutations must reach every outcome, or the fuzz is only testing one path.
    expect(outcomes.ok).toBeGreaterThan(0);
    expect(outcomes.json).toBeGreaterThan(0);
    expect(outcomes.field).toBeGreaterThan(0);
  });

  it('random bytes give RequestPeekError, never another exception', () => {
    fc.assert(
      fc.property(fc.uint8Array({ maxLength: 600 }), (body) => {
        expect(() => peekRequest(body)).toThrow(RequestPeekError);
      }),
      { numRuns: 2000 },
    );
  });
});
