import { Buffer } from 'node:buffer';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { peekRequest, RequestPeekError } from '../src/index.js';
import { requestMembers, serialize, style, tokenSoup } from './arbitraries.js';
import { bytes, checkAgainstOracle, expectedFor } from './helpers.js';

describe('peekRequest agrees with JSON.parse', () => {
  it('on request-like objects: fields, errors and spans', () => {
    let ok = 0;
    fc.assert(
      fc.property(requestMembers, style, (members, s) => {
        const result = checkAgainstOracle(bytes(serialize(members, s)));
        if (!(result instanceof RequestPeekError)) ok++;
      }),
      { numRuns: 2000 },
    );
    // The generator must mostly produce requests that pass, or the span checks prove little.
    expect(ok).toBeGreaterThan(500);
  });

  it('on any JSON value at the top level', () => {
    fc.assert(
      fc.property(fc.jsonValue(), style, (value, s) => {
        checkAgainstOracle(bytes(serialize(value, s)));
      }),
      { numRuns: 500 },
    );
  });

  it('on arbitrary strings: throws RequestPeekError exactly when the oracle refuses', () => {
    fc.assert(
      fc.property(fc.oneof(fc.string(), fc.string({ unit: 'binary' }), fc.json()), (text) => {
        checkAgainstOracle(bytes(text));
      }),
      { numRuns: 2000 },
    );
  });

  it('on JSON-shaped token soup', () => {
    let refused = 0;
    fc.assert(
      fc.property(tokenSoup, (text) => {
        if (checkAgainstOracle(bytes(text)) instanceof RequestPeekError) refused++;
      }),
      { numRuns: 5000 },
    );
    expect(refused).toBeGreaterThan(0);
  });

  it('whatever the alignment of the bytes in their buffer', () => {
    fc.assert(
      fc.property(requestMembers, style, fc.nat(7), (members, s, pad) => {
        const text = bytes(serialize(members, s));
        const backing = new Uint8Array(text.length + pad + 3).fill(0x22);
        backing.set(text, pad);
        const body = backing.subarray(pad, pad + text.length);
        const expected = expectedFor(body);
        let got: unknown;
        try {
          got = peekRequest(body);
        } catch (error) {
          got = error;
        }
        let want: unknown;
        try {
          want = peekRequest(Buffer.from(text));
        } catch (error) {
          want = error;
        }
        expect(got).toStrictEqual(want);
        expect(got instanceof RequestPeekError).toBe(expected.kind !== 'ok');
      }),
      { numRuns: 500 },
    );
  });
});

describe('long strings (the word-at-a-time path)', () => {
  const special = fc.constantFrom(
    '"',
    '\\',
    '\\"',
    '\\\\',
    '\\n',
    '\\u00e9',
    '\\ud83d\\ude00',
    '\\x',
    '\\u12',
    '\n',
    '\u0000',
    '\u001f',
    ' ',
    '!',
    '#',
    '[',
    ']',
    '\u007f',
    'é',
    '😀',
  );
  const raw = fc
    .tuple(
      fc.nat(700),
      fc.array(fc.tuple(fc.nat(700), special), { maxLength: 4 }),
      fc.constantFrom('a', 'ab', 'abc', 'é', '中'),
    )
    .map(([length, inserts, filler]) => {
      let text = filler.repeat(length);
      for (const [at, s] of inserts) {
        const k = at % (text.length + 1);
        text = text.slice(0, k) + s + text.slice(k);
      }
      return text;
    });

  it('find the closing quote, escapes and raw control bytes at every alignment', () => {
    fc.assert(
      fc.property(raw, fc.nat(7), fc.nat(3), (content, pad, lead) => {
        const text = bytes(`${' '.repeat(lead)}{"model":"${content}","stream":true}`);
        const backing = new Uint8Array(text.length + pad + 5).fill(0x61);
        backing.set(text, pad);
        checkAgainstOracle(backing.subarray(pad, pad + text.length));
      }),
      { numRuns: 3000 },
    );
  });
});
