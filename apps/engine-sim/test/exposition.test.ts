import { describe, expect, it } from 'vitest';
import { goFloat } from '../src/exposition.ts';

describe('goFloat (prometheus_client floatToGoString)', () => {
  it.each([
    [0, '0.0'],
    [1, '1.0'],
    [65536, '65536.0'],
    [0.5399, '0.5399'],
    [1000000, '1e+06'],
    [1764355200.25, '1.76435520025e+09'],
    [0.00001, '1e-05'],
    [Infinity, '+Inf'],
    [-Infinity, '-Inf'],
    [NaN, 'NaN'],
    [-2.5, '-2.5'],
  ])('writes %d as %s', (value, text) => {
    expect(goFloat(value)).toBe(text);
  });
});
