import { Buffer, isUtf8 } from 'node:buffer';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { invalidUtf8At } from '../src/utf8.js';
import { bytes, peekError } from './helpers.js';

const withBytes = (before: string, raw: number[], after: string): Buffer =>
  Buffer.concat([bytes(before), Buffer.from(raw), bytes(after)]);

describe('peekRequest: invalid UTF-8', () => {
  it.each([
    ['a lone continuation byte', [0x80]],
    ['a truncated 2-byte sequence', [0xc3]],
    ['an overlong encoding of "/"', [0xc0, 0xaf]],
    ['an overlong 3-byte sequence', [0xe0, 0x80, 0x80]],
    ['a UTF-16 surrogate (CESU-8)', [0xed, 0xa0, 0x80]],
    ['a code point above U+10FFFF', [0xf4, 0x90, 0x80, 0x80]],
    ['a byte that never occurs', [0xff]],
  ])('refuses %s in the model and says at which byte', (_name, raw) => {
    const body = withBytes('{"model":"é', raw, '","messages":[]}');
    const error = peekError(body);
    const at = Buffer.byteLength('{"model":"é');
    expect(error.code).toBe('ERR_JSON');
    expect(error.offset).toBe(at);
    expect(error.message).toBe(
      `invalid JSON at byte ${at}: invalid UTF-8 (byte 0x${raw[0]!.toString(16)})`,
    );
  });

  it('refuses invalid UTF-8 in a value it would otherwise skip', () => {
    const body = withBytes('{"model":"m","messages":[{"content":"', [0xfe], '"}]}');
    expect(peekError(body).message).toMatch(/invalid UTF-8/);
  });

  it('finds the first invalid byte exactly where Node says the bytes are invalid', () => {
    fc.assert(
      fc.property(fc.uint8Array({ maxLength: 24 }), fc.string({ maxLength: 8 }), (raw, text) => {
        const b = Buffer.concat([bytes(text), Buffer.from(raw)]);
        const at = invalidUtf8At(b);
        expect(at === -1).toBe(isUtf8(b));
        if (at >= 0) {
          // Everything before it is valid; the sequence that starts there is not.
          expect(isUtf8(b.subarray(0, at))).toBe(true);
          expect(at).toBeGreaterThanOrEqual(Buffer.byteLength(text));
        }
      }),
      { numRuns: 3000 },
    );
  });
});
