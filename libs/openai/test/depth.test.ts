import { describe, expect, it } from 'vitest';
import { MAX_DEPTH, peekRequest, RequestPeekError } from '../src/index.js';
import { bytes, peekError } from './helpers.js';

const DEEP = 100_000;

describe('peekRequest: nesting', () => {
  it('is capped at 512 levels, the top-level object included', () => {
    expect(MAX_DEPTH).toBe(512);
  });

  it('refuses 100,000 nested arrays inside a field with a clean error, not a RangeError', () => {
    const head = '{"model":"m","junk":';
    const text = `${head}${'['.repeat(DEEP)}${']'.repeat(DEEP)}}`;
    const error = peekError(text);
    expect(error).toBeInstanceOf(RequestPeekError);
    expect(error.code).toBe('ERR_JSON');
    // The '[' at head.length sits at depth 2, so the one that would make depth 513 is 511 later.
    expect(error.offset).toBe(head.length + MAX_DEPTH - 1);
    expect(error.message).toBe(
      `invalid JSON at byte ${head.length + 511}: nesting deeper than 512 levels is not accepted`,
    );
  });

  it('refuses 100,000 nested objects, and unclosed nesting, the same way', () => {
    const objects = `{"model":"m","a":${'{"a":'.repeat(DEEP)}1${'}'.repeat(DEEP)}}`;
    expect(peekError(objects).code).toBe('ERR_JSON');
    expect(peekError(`{"model":"m","a":${'['.repeat(DEEP)}`).offset).toBe(17 + 511);
    expect(peekError('['.repeat(DEEP)).offset).toBe(MAX_DEPTH);
  });

  it('accepts exactly 512 levels', () => {
    const inner = MAX_DEPTH - 1;
    const text = `{"model":"m","junk":${'['.repeat(inner)}${']'.repeat(inner)}}`;
    expect(peekRequest(bytes(text)).model).toBe('m');
    expect(() => JSON.parse(text)).not.toThrow();
    const over = `{"model":"m","junk":${'['.repeat(inner + 1)}${']'.repeat(inner + 1)}}`;
    expect(peekError(over).offset).toBe(20 + inner);
  });

  it('accepts wide bodies (many siblings) at any size', () => {
    const text = `{"model":"m","junk":[${'[1,{"a":[]}],'.repeat(DEEP)}0]}`;
    expect(peekRequest(bytes(text)).model).toBe('m');
  });
});
