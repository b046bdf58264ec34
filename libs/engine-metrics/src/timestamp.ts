import { DIGIT_0, isDigit, MINUS, PLUS } from './chars.js';
import type { Cursor } from './cursor.js';
import { fail, quote } from './cursor.js';

/**
 * A sample timestamp: an integer number of milliseconds, optionally signed (Go's
 * strconv.ParseInt). Rejected beyond ±2^53-1, where a JS number stops being exact.
 */
export function readTimestamp(cur: Cursor, start: number, end: number, name: string): number {
  const text = cur.text;
  let i = start;
  const sign = text.charCodeAt(i);
  if (sign === PLUS || sign === MINUS) i++;
  if (i === end)
    fail(cur, `invalid timestamp ${quote(text.slice(start, end))} for sample "${name}"`);
  let value = 0;
  for (; i < end; i++) {
    const c = text.charCodeAt(i);
    if (!isDigit(c)) {
      fail(cur, `invalid timestamp ${quote(text.slice(start, end))} for sample "${name}"`);
    }
    value = value * 10 + (c - DIGIT_0);
  }
  if (value > Number.MAX_SAFE_INTEGER) {
    fail(cur, `timestamp ${quote(text.slice(start, end))} of sample "${name}" is out of range`);
  }
  return sign === MINUS && value !== 0 ? -value : value;
}
