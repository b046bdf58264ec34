// The validating JSON walk: skips values without building them, iteratively (no recursion),
// over raw UTF-8 bytes. Every function takes the body, a position and the body's length and
// returns the position after what it consumed; every error is a RequestPeekError.
//
// The loops here compare against byte literals (named in a comment) rather than the constants
// in bytes.ts: V8 reloads an imported binding on every use, which measured up to 2× slower in
// these loops. Tables are copied into locals for the same reason.

import { ESCAPE, HEX, STRING_STOP, describeByte } from './bytes.js';
import { RequestPeekError } from './errors.js';

/** Deepest nesting accepted, counting the top-level object as 1. */
export const MAX_DEPTH = 512;

const OBJECT = 1;
const ARRAY = 2;
/** Container kind per depth. One walk at a time (the walk is synchronous), so one is enough. */
const STACK = new Uint8Array(MAX_DEPTH + 1);

let escapedFlag = false;

/** Whether the string `scanString` last returned from held a backslash escape. */
export function lastStringEscaped(): boolean {
  return escapedFlag;
}

export function endOfInput(n: number, detail: string): RequestPeekError {
  return RequestPeekError.json(n, `unexpected end of input, ${detail}`);
}

/** An error for byte `i` (or the end of input) where `expected` was. */
export function unexpected(
  b: Uint8Array,
  i: number,
  n: number,
  expected: string,
): RequestPeekError {
  if (i >= n) return endOfInput(n, expected);
  return RequestPeekError.json(i, `unexpected ${describeByte(b[i]!)}, ${expected}`);
}

/** Skips JSON whitespace: space, tab, LF, CR. */
export function skipWhitespace(b: Uint8Array, i: number, n: number): number {
  while (i < n) {
    const c = b[i]!;
    if (c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09) i++;
    else break;
  }
  return i;
}

// Word view of the body for the string fast path: W[k] holds body bytes A0 + 4k .. A0 + 4k + 3
// (A0 is the first 4-byte-aligned offset). Bound by peekRequest for one walk, then released.
const NO_WORDS = new Int32Array(0);
let W: Int32Array = NO_WORDS;
let A0 = 0;
/** Bodies shorter than this are scanned byte by byte only. */
const WORDS_FROM = 256;

/** Lets scanString read `b` four bytes at a time; call `releaseWords` when the walk ends. */
export function bindWords(b: Uint8Array): void {
  if (b.length < WORDS_FROM) return;
  const first = (4 - (b.byteOffset & 3)) & 3;
  W = new Int32Array(b.buffer, b.byteOffset + first, (b.length - first) >> 2);
  A0 = first;
}

export function releaseWords(): void {
  W = NO_WORDS;
  A0 = 0;
}

/**
 * Scans a string whose opening quote is at `i - 1`; returns the position after the closing
 * quote. Checks escapes and that no byte below 0x20 appears raw; bytes from 0x80 up pass as
 * they are (UTF-8 is not validated).
 *
 * Plain content is skipped a word at a time: a word goes through unless one of its bytes may be
 * below 0x20, '"' or '\' (the has-less / has-zero bit tricks, exact as to whether such a byte
 * exists); the byte loop then finds which one.
 */
export function scanString(b: Uint8Array, i: number, n: number): number {
  const open = i - 1;
  const stop = STRING_STOP;
  const words = W;
  const a0 = A0;
  const nw = words.length;
  let escaped = false;
  for (;;) {
    while (i < n && ((i - a0) & 3) !== 0 && stop[b[i]!] === 0) i++;
    if (i < n && stop[b[i]!] === 0) {
      let k = (i - a0) >> 2;
      while (k < nw) {
        const x = words[k]!;
        const q = x ^ 0x22222222; // '"' bytes become zero
        const s = x ^ 0x5c5c5c5c; // '\' bytes become zero
        if (
          (((x - 0x20202020) & ~x) | ((q - 0x01010101) & ~q) | ((s - 0x01010101) & ~s)) &
          0x80808080
        ) {
          break;
        }
        k++;
      }
      if (k > (i - a0) >> 2) i = a0 + (k << 2);
      while (i < n && stop[b[i]!] === 0) i++;
    }
    if (i >= n) throw endOfInput(n, `in the string that starts at byte ${open}`);
    const c = b[i]!;
    if (c === 0x22 /* " */) {
      escapedFlag = escaped;
      return i + 1;
    }
    if (c === 0x5c /* \ */) {
      escaped = true;
      if (i + 1 >= n) throw endOfInput(n, 'in a string escape');
      const kind = ESCAPE[b[i + 1]!];
      if (kind === 1) {
        i += 2;
        continue;
      }
      if (kind === 2) {
        if (i + 6 > n) throw endOfInput(n, 'in a \\u escape');
        const hex = HEX;
        if ((hex[b[i + 2]!]! | hex[b[i + 3]!]! | hex[b[i + 4]!]! | hex[b[i + 5]!]!) < 0) {
          throw RequestPeekError.json(i, 'a \\u escape needs 4 hex digits');
        }
        i += 6;
        continue;
      }
      throw RequestPeekError.json(
        i,
        `invalid escape in a string: '\\' followed by ${describeByte(b[i + 1]!)}`,
      );
    }
    throw RequestPeekError.json(
      i,
      `control character ${describeByte(c)} in a string must be escaped`,
    );
  }
}

/** Skips decimal digits. */
function skipDigits(b: Uint8Array, i: number, n: number): number {
  while (i < n) {
    const c = b[i]!;
    if (c >= 0x30 && c <= 0x39) i++;
    else break;
  }
  return i;
}

/** Scans a number starting at `i` (a digit or '-'); returns the position after it. */
export function scanNumber(b: Uint8Array, i: number, n: number): number {
  if (b[i] === 0x2d /* - */) i++;
  let j = skipDigits(b, i, n);
  if (j === i) throw unexpected(b, i, n, "expected a digit after '-'");
  if (b[i] === 0x30 /* 0 */ && j > i + 1) {
    throw RequestPeekError.json(i, 'a number must not have leading zeros');
  }
  i = j;
  if (i < n && b[i] === 0x2e /* . */) {
    j = skipDigits(b, i + 1, n);
    if (j === i + 1) throw unexpected(b, j, n, "expected a digit after '.'");
    i = j;
  }
  if (i < n && (b[i] === 0x65 /* e */ || b[i] === 0x45) /* E */) {
    i++;
    if (i < n && (b[i] === 0x2b /* + */ || b[i] === 0x2d) /* - */) i++;
    j = skipDigits(b, i, n);
    if (j === i) throw unexpected(b, i, n, 'expected a digit in the exponent');
    i = j;
  }
  return i;
}

/** Checks the rest of `true`, `false` or `null` after its first byte (error path included). */
function scanLiteral(b: Uint8Array, i: number, n: number, word: string): number {
  for (let k = 1; k < word.length; k++) {
    if (i + k >= n || b[i + k] !== word.charCodeAt(k)) {
      throw unexpected(b, i + k, n, `expected '${word}'`);
    }
  }
  return i + word.length;
}

/** At `i` an object key must start; scans it and the ':' after it; returns the value's start. */
function scanKey(b: Uint8Array, i: number, n: number): number {
  if (i >= n || b[i] !== 0x22 /* " */) {
    throw unexpected(b, i, n, `expected '"' to start an object key`);
  }
  i = scanString(b, i + 1, n);
  if (i < n && b[i] !== 0x3a /* : */) i = skipWhitespace(b, i, n);
  if (i >= n || b[i] !== 0x3a /* : */)
    throw unexpected(b, i, n, "expected ':' after an object key");
  return skipWhitespace(b, i + 1, n);
}

function tooDeep(i: number): RequestPeekError {
  return RequestPeekError.json(i, `nesting deeper than ${MAX_DEPTH} levels is not accepted`);
}

/**
 * Validates one JSON value starting at `i` (no whitespace before it) that sits `depth`
 * containers deep, and returns the position after it. Iterative: nesting costs one byte of
 * STACK per level and is capped at MAX_DEPTH.
 */
export function skipValue(b: Uint8Array, i: number, n: number, depth: number): number {
  const base = depth;
  const stack = STACK;
  value: for (;;) {
    if (i >= n) throw endOfInput(n, 'expected a value');
    let c = b[i]!;
    if (c === 0x22 /* " */) {
      i = scanString(b, i + 1, n);
    } else if (c === 0x7b /* { */) {
      if (depth >= MAX_DEPTH) throw tooDeep(i);
      stack[++depth] = OBJECT;
      i = skipWhitespace(b, i + 1, n);
      if (i < n && b[i] === 0x7d /* } */) {
        i++;
        depth--;
      } else {
        i = scanKey(b, i, n);
        continue;
      }
    } else if (c === 0x5b /* [ */) {
      if (depth >= MAX_DEPTH) throw tooDeep(i);
      stack[++depth] = ARRAY;
      i = skipWhitespace(b, i + 1, n);
      if (i < n && b[i] === 0x5d /* ] */) {
        i++;
        depth--;
      } else {
        continue;
      }
    } else if (c >= 0x31 && c <= 0x39 /* 1-9 */) {
      // Plain integers inline; a fraction or exponent goes back through scanNumber.
      const j = skipDigits(b, i + 1, n);
      const d = j < n ? b[j]! : 0;
      i = d === 0x2e /* . */ || d === 0x65 /* e */ || d === 0x45 /* E */ ? scanNumber(b, i, n) : j;
    } else if (c === 0x2d /* - */ || c === 0x30 /* 0 */) {
      i = scanNumber(b, i, n);
    } else if (c === 0x74 /* t */) {
      i =
        i + 3 < n && b[i + 1] === 0x72 && b[i + 2] === 0x75 && b[i + 3] === 0x65
          ? i + 4
          : scanLiteral(b, i, n, 'true');
    } else if (c === 0x66 /* f */) {
      i =
        i + 4 < n &&
        b[i + 1] === 0x61 &&
        b[i + 2] === 0x6c &&
        b[i + 3] === 0x73 &&
        b[i + 4] === 0x65
          ? i + 5
          : scanLiteral(b, i, n, 'false');
    } else if (c === 0x6e /* n */) {
      i =
        i + 3 < n && b[i + 1] === 0x75 && b[i + 2] === 0x6c && b[i + 3] === 0x6c
          ? i + 4
          : scanLiteral(b, i, n, 'null');
    } else {
      throw unexpected(b, i, n, 'expected a value');
    }
    // After a value: close containers until one continues with ','.
    for (;;) {
      if (depth === base) return i;
      const inObject = stack[depth] === OBJECT;
      c = i < n ? b[i]! : 0;
      if (c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09) {
        i = skipWhitespace(b, i + 1, n);
        c = i < n ? b[i]! : 0;
      }
      if (c === 0x2c /* , */) {
        i++;
        c = i < n ? b[i]! : 0;
        if (c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09) i = skipWhitespace(b, i + 1, n);
        if (inObject) i = scanKey(b, i, n);
        continue value;
      }
      if (c === (inObject ? 0x7d /* } */ : 0x5d) /* ] */) {
        i++;
        depth--;
        continue;
      }
      throw unexpected(
        b,
        i,
        n,
        inObject
          ? "expected ',' or '}' after an object member"
          : "expected ',' or ']' after an array element",
      );
    }
  }
}
