import { describe, expect, it } from 'vitest';
import { RequestPeekError } from '../src/index.js';
import { peekError } from './helpers.js';

describe('RequestPeekError', () => {
  it('carries code and offset for bad JSON', () => {
    const error = peekError('{"model":"m",,}');
    expect(error).toBeInstanceOf(Error);
    expect(error).toBeInstanceOf(RequestPeekError);
    expect(error.name).toBe('RequestPeekError');
    expect(error.code).toBe('ERR_JSON');
    expect(error.offset).toBe(13);
    expect(error.field).toBeUndefined();
    expect(error.message).toBe(
      `invalid JSON at byte 13: unexpected ',', expected '"' to start an object key`,
    );
  });

  it('carries code, field and the value offset for a bad field', () => {
    const error = peekError('{"model":"m","max_tokens":-5}');
    expect(error.code).toBe('ERR_FIELD');
    expect(error.field).toBe('max_tokens');
    expect(error.offset).toBe(26);
    expect(error.message).toBe('max_tokens must be a non-negative integer or null');
  });
});
