import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { peekRequest } from '../src/index.js';
import { numberAsBool, strAsBool, strAsInt } from '../src/lax.js';
import { peekError, pydanticBool, pydanticInt } from './helpers.js';

/**
 * What pydantic answered for each value in an `int | None` and a `bool | None` field, as
 * vLLM's request models declare them (fixtures/pydantic-lax.py wrote it; the versions are in
 * the file). "refused" is a validation error, which vLLM answers with a 400.
 */
interface Corpus {
  readonly pydantic: string;
  readonly int: [string, number | 'refused'][];
  readonly bool: [string, boolean | 'refused'][];
  readonly intValues: [unknown, number | 'refused'][];
  readonly boolValues: [unknown, boolean | 'refused'][];
}
const corpus = JSON.parse(
  readFileSync(new URL('./fixtures/pydantic-lax.json', import.meta.url), 'utf8'),
) as Corpus;

const peek = (text: string) => peekRequest(Buffer.from(text));

describe("pydantic's lax int, as vLLM reads a string in an int field", () => {
  it(`agrees with pydantic ${corpus.pydantic} on ${corpus.int.length} strings`, () => {
    let accepted = 0;
    for (const [text, want] of corpus.int) {
      const got = strAsInt(text);
      // and so does the property tests' oracle, written apart from the code
      const oracle = pydanticInt(text);
      if (want === 'refused') {
        expect(got, JSON.stringify(text)).toBeNaN();
        expect(oracle, JSON.stringify(text)).toBe('bad');
      } else if (Number.isSafeInteger(want)) {
        accepted++;
        expect(got, JSON.stringify(text)).toBe(want);
        expect(oracle, JSON.stringify(text)).toBe(want);
      } else {
        // taken by pydantic, but no double holds it: the peek refuses it as it refuses the number
        expect(Number.isSafeInteger(got), JSON.stringify(text)).toBe(false);
      }
    }
    expect(accepted).toBeGreaterThan(150);
    for (const [value, want] of corpus.intValues) {
      expect(pydanticInt(value)).toBe(want === 'refused' ? 'bad' : want);
    }
  });

  it('through the peek: every limit, min_tokens and n read the string as pydantic does', () => {
    for (const [text, want] of corpus.int) {
      const value = JSON.stringify(text);
      for (const [key, field, min] of [
        ['max_tokens', 'maxTokens', 0],
        ['max_completion_tokens', 'maxCompletionTokens', 0],
        ['min_tokens', 'minTokens', 0],
        ['n', 'n', 1],
      ] as const) {
        const body = `{"model":"m","${key}":${value}}`;
        if (want !== 'refused' && Number.isSafeInteger(want) && want >= min) {
          expect(peek(body)[field], body).toBe(want);
        } else {
          // refused with the message a number out of range gets
          const error = peekError(body);
          expect(error.field, body).toBe(key);
          const kind = min === 0 ? 'non-negative' : 'positive';
          expect(error.message).toBe(`${key} must be a ${kind} integer or null`);
          expect(error.offset).toBe(`{"model":"m","${key}":`.length);
        }
      }
    }
  });

  it('reads a string with escapes after unescaping it, as json.loads does', () => {
    expect(peek('{"model":"m","max_tokens":"\\u0031\\u0030\\u0030"}').maxTokens).toBe(100);
    expect(peek('{"model":"m","max_tokens":"\\t100\\n"}').maxTokens).toBe(100);
    expect(peek('{"model":"m","max_tokens":"\\u00a0100"}').maxTokens).toBe(100);
    expect(peekError('{"model":"m","max_tokens":"\\ufeff100"}').field).toBe('max_tokens');
  });

  it('reads the other values pydantic takes in an int field (true, false, 2.0)', () => {
    for (const [value, want] of corpus.intValues) {
      const body = `{"model":"m","max_tokens":${JSON.stringify(value)}}`;
      if (want === 'refused' || want < 0) expect(peekError(body).field).toBe('max_tokens');
      else expect(peek(body).maxTokens, body).toBe(want);
    }
  });
});

describe("pydantic's lax bool, as vLLM reads stream", () => {
  it(`agrees with pydantic ${corpus.pydantic} on ${corpus.bool.length} strings`, () => {
    for (const [text, want] of corpus.bool) {
      expect(strAsBool(text), JSON.stringify(text)).toBe(want === 'refused' ? undefined : want);
      expect(pydanticBool(text), JSON.stringify(text)).toBe(want === 'refused' ? 'bad' : want);
    }
    for (const [value, want] of corpus.boolValues) {
      expect(pydanticBool(value)).toBe(want === 'refused' ? 'bad' : want);
    }
  });

  it('and on the numbers and booleans it takes (0, 1, 0.0, 1.0, -0.0)', () => {
    for (const [value, want] of corpus.boolValues) {
      const body = `{"model":"m","stream":${JSON.stringify(value)}}`;
      if (want === 'refused') {
        expect(peekError(body).message).toBe('stream must be a boolean or null');
        if (typeof value === 'number') expect(numberAsBool(value)).toBeUndefined();
      } else {
        expect(peek(body).stream, body).toBe(want);
      }
    }
  });

  it('through the peek: stream read from any string pydantic takes, refused otherwise', () => {
    for (const [text, want] of corpus.bool) {
      const body = `{"model":"m","stream":${JSON.stringify(text)}}`;
      if (want === 'refused') {
        const error = peekError(body);
        expect(error.field, body).toBe('stream');
        expect(error.message).toBe('stream must be a boolean or null');
        expect(error.offset).toBe(22);
      } else {
        expect(peek(body).stream, body).toBe(want);
      }
    }
    // escaped, and too long to be any word
    expect(peek('{"model":"m","stream":"\\u0074rue"}').stream).toBe(true);
    expect(peekError(`{"model":"m","stream":"${'\\u0020'.repeat(6)}"}`).field).toBe('stream');
  });
});
