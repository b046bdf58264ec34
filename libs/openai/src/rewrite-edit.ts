// The mechanics of a rewrite: an Edit is one splice into the body, and `splice` builds the new
// body from the old one's slices and the edits' bytes. Which edits to make is decided elsewhere
// (rewrite-instruction.ts, rewrite-limits.ts); nothing here reads the JSON.

import { Buffer } from 'node:buffer';

/** One splice: bytes [start, end) of the body are replaced by `bytes` (an insert when equal). */
export interface Edit {
  readonly start: number;
  readonly end: number;
  readonly bytes: Uint8Array;
}

export const utf8 = (text: string): Buffer => Buffer.from(text, 'utf8');

/** The body with `edits` applied, built from slices in ascending order with one copy. */
export function splice(b: Uint8Array, edits: Edit[]): Buffer {
  edits.sort((x, y) => x.start - y.start || x.end - y.end);
  const parts: Uint8Array[] = [];
  let at = 0;
  let length = b.length;
  for (const e of edits) {
    if (e.start < at) throw new Error('rewriteRequest: overlapping edits (a bug)');
    if (e.start > at) parts.push(b.subarray(at, e.start));
    parts.push(e.bytes);
    length += e.bytes.length - (e.end - e.start);
    at = e.end;
  }
  if (at < b.length) parts.push(b.subarray(at));
  return Buffer.concat(parts, length);
}
