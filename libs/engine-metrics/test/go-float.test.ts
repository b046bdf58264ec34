import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { parseGoFloat } from '../src/go-float.js';

function parse(token: string): number | undefined {
  return parseGoFloat(`  ${token}  `, 2, 2 + token.length);
}

describe('parseGoFloat', () => {
  it('reads only the given range of the text', () => {
    expect(parseGoFloat('x12.5y', 1, 5)).toBe(12.5);
    expect(parseGoFloat('1e5', 0, 1)).toBe(1);
    expect(parseGoFloat('Infinity', 0, 3)).toBe(Infinity);
  });

  it('agrees with Number() on every decimal spelling, fast path or not', () => {
    const digits = (max: number) =>
      fc.string({ unit: fc.constantFrom(...'0123456789'), maxLength: max });
    const decimal = fc
      .record({
        sign: fc.constantFrom('', '+', '-'),
        int: digits(20),
        frac: fc.option(digits(20), { nil: undefined }),
        exp: fc.option(
          fc.tuple(
            fc.constantFrom('e', 'E'),
            fc.constantFrom('', '+', '-'),
            fc.integer({ min: 0, max: 330 }),
          ),
          { nil: undefined },
        ),
      })
      .filter(({ int, frac }) => int.length + (frac?.length ?? 0) > 0)
      .map(({ sign, int, frac, exp }) => {
        const mantissa = frac === undefined ? int : `${int}.${frac}`;
        return sign + mantissa + (exp ? `${exp[0]}${exp[1]}${exp[2]}` : '');
      });
    fc.assert(
      fc.property(decimal, (token) => {
        const expected = Number(token);
        const got = parse(token);
        if (Number.isFinite(expected)) expect(Object.is(got, expected)).toBe(true);
        else expect(got).toBeUndefined();
      }),
      { numRuns: 2000 },
    );
  });

  it('reads back the shortest and the exponential spelling of any double', () => {
    fc.assert(
      fc.property(fc.double({ noNaN: true, noDefaultInfinity: true }), (v) => {
        expect(Object.is(parse(Object.is(v, -0) ? '-0' : String(v)), v)).toBe(true);
        // toExponential and toPrecision drop the sign of -0.
        const unsigned = Object.is(v, -0) ? 0 : v;
        expect(parse(v.toExponential())).toBe(unsigned);
        expect(parse(v.toPrecision(17))).toBe(unsigned);
      }),
      { numRuns: 2000 },
    );
  });

  it('reads the 15-digit fast path exactly', () => {
    expect(parse('999999999999999')).toBe(999999999999999);
    expect(parse('9007199254740993')).toBe(9007199254740992);
    expect(parse('0.000000000000000000000123')).toBe(1.23e-22);
    expect(parse('1.5e22')).toBe(1.5e22);
    expect(parse('1e23')).toBe(1e23);
    expect(parse('123456789012345e-22')).toBe(1.23456789012345e-8);
  });
});
