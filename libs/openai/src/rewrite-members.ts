// The raw-byte walk that the rewrite's own scans share (rewrite-instruction.ts for the messages,
// rewrite-limits.ts for the top-level keys): the members of one object, a value skipped whole,
// and the two words (`text`, `type`) both compare keys and values against. The body is one
// peekRequest validated, so nothing here checks the JSON again.

import { decodeString } from './decode.js';
import { lastStringEscaped, scanString, skipWhitespace } from './scan.js';

/**
 * Skips one non-string value of the validated body at `i`: a container with everything in it
 * (depth counted, no recursion), or a number or literal. Returns the position after it.
 */
export function skipOther(b: Uint8Array, i: number, n: number): number {
  let c = b[i]!;
  if (c !== 0x7b /* { */ && c !== 0x5b /* [ */) {
    // A number or a literal: runs to the next structural byte or whitespace.
    while (i < n) {
      c = b[i]!;
      if (c === 0x2c || c === 0x7d || c === 0x5d || c === 0x20 || c === 0x0a) break;
      if (c === 0x0d || c === 0x09) break;
      i++;
    }
    return i;
  }
  let depth = 0;
  while (i < n) {
    c = b[i++]!;
    if (c === 0x22 /* " */) i = scanString(b, i, n);
    else if (c === 0x7b /* { */ || c === 0x5b /* [ */) depth++;
    else if ((c === 0x7d /* } */ || c === 0x5d) /* ] */ && --depth === 0) return i;
  }
  return i;
}

/**
 * Calls `member` for each member of the object at `i` (its '{'; `n` bounds the scan), in
 * order: the key's raw bytes are [key, keyEnd), the value is [value, end) (a string there
 * with its quotes), and the escape flags say whether the key's or a string value's bytes hold
 * an escape. Nested values are skipped by depth counting, without recursion. Returns the
 * position after the object's '}', or -1 when there is no object at `i`.
 */
export function eachMember(
  b: Uint8Array,
  i: number,
  n: number,
  member: (
    key: number,
    keyEnd: number,
    keyEscaped: boolean,
    value: number,
    end: number,
    valueEscaped: boolean,
  ) => void,
): number {
  if (b[i] !== 0x7b /* { */) return -1;
  i = skipWhitespace(b, i + 1, n);
  while (i < n && b[i] === 0x22 /* " */) {
    const key = i + 1;
    i = scanString(b, key, n);
    const keyEscaped = lastStringEscaped();
    const keyEnd = i - 1;
    i = skipWhitespace(b, i, n); // to ':'
    const value = skipWhitespace(b, i + 1, n);
    const isString = b[value] === 0x22; /* " */
    i = isString ? scanString(b, value + 1, n) : skipOther(b, value, n);
    member(key, keyEnd, keyEscaped, value, i, isString && lastStringEscaped());
    i = skipWhitespace(b, i, n);
    if (b[i] !== 0x2c /* , */) break; // '}': the object ends
    i = skipWhitespace(b, i + 1, n);
  }
  return i + 1;
}

/** `text` or `type` when the string [s, e) is that word (after unescaping), else ''. */
export function partKey(b: Uint8Array, s: number, e: number, isEscaped: boolean): string {
  if (isEscaped) {
    if (e - s > 4 * 6) return '';
    const word = decodeString(b, s, e);
    return word === 'text' || word === 'type' ? word : '';
  }
  if (e - s !== 4 || b[s] !== 0x74 /* t */) return '';
  if (b[s + 1] === 0x65 /* e */ && b[s + 2] === 0x78 /* x */ && b[s + 3] === 0x74 /* t */)
    return 'text';
  if (b[s + 1] === 0x79 /* y */ && b[s + 2] === 0x70 /* p */ && b[s + 3] === 0x65 /* e */)
    return 'type';
  return '';
}
