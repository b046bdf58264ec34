import { describe, expect, it } from 'vitest';
import { parseExposition, sampleValue } from '../src/index.js';

describe('sampleValue', () => {
  const exposition = parseExposition(
    [
      'a{engine="0",model="m"} 1',
      'a{engine="1",model="m"} 2',
      'a{engine="1",model="m",extra="x"} 3',
      'b 4',
      'c{constructor="k"} 5',
    ].join('\n'),
  );

  it('returns the first sample with the name', () => {
    expect(sampleValue(exposition, 'a')).toBe(1);
    expect(sampleValue(exposition, 'b')).toBe(4);
  });

  it('matches a subset of labels', () => {
    expect(sampleValue(exposition, 'a', { engine: '1' })).toBe(2);
    expect(sampleValue(exposition, 'a', { extra: 'x' })).toBe(3);
    expect(sampleValue(exposition, 'a', {})).toBe(1);
  });

  it('returns undefined when nothing matches', () => {
    expect(sampleValue(exposition, 'missing')).toBeUndefined();
    expect(sampleValue(exposition, 'a', { engine: '2' })).toBeUndefined();
    expect(sampleValue(exposition, 'b', { engine: '0' })).toBeUndefined();
  });

  it('does not mistake inherited object keys for labels', () => {
    expect(sampleValue(exposition, 'b', { constructor: 'k' })).toBeUndefined();
    expect(sampleValue(exposition, 'c', { constructor: 'k' })).toBe(5);
  });
});
