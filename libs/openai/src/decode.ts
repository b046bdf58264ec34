// Decoding of the few values peekRequest returns: strings (with escapes) and numbers. Input
// spans were validated by the walk already, so these do no checking of their own.

import { BACKSLASH, HEX, ZERO } from './bytes.js';

// ignoreBOM keeps a leading U+FEFF in a value, as JSON.parse does.
const UTF8 = new TextDecoder('utf-8', { ignoreBOM: true });

/** UTF-8 bytes [s, e) as a string; invalid sequences become U+FFFD, as Buffer#toString does. */
export function utf8(b: Uint8Array, s: number, e: number): string {
  if (e - s <= 32) {
    let ascii = '';
    for (let i = s; i < e; i++) {
      const c = b[i]!;
      if (c >= 0x80) return UTF8.decode(b.subarray(s, e));
      ascii += String.fromCharCode(c);
    }
    return ascii;
  }
  return UTF8.decode(b.subarray(s, e));
}

function nextBackslash(b: Uint8Array, i: number, e: number): number {
  while (i < e && b[i] !== BACKSLASH) i++;
  return i;
}

const SIMPLE: Record<number, string> = {
  0x22: '"',
  0x5c: '\\',
  0x2f: '/',
  0x62: '\b',
  0x66: '\f',
  0x6e: '\n',
  0x72: '\r',
  0x74: '\t',
};

/** The content [s, e) of a validated JSON string (between its quotes), unescaped. */
export function decodeString(b: Uint8Array, s: number, e: number): string {
  let bs = nextBackslash(b, s, e);
  if (bs === e) return utf8(b, s, e);
  let out = '';
  let from = s;
  while (bs < e) {
    out += utf8(b, from, bs);
    const c = b[bs + 1]!;
    if (c === 0x75) {
      const unit =
        (HEX[b[bs + 2]!]! << 12) |
        (HEX[b[bs + 3]!]! << 8) |
        (HEX[b[bs + 4]!]! << 4) |
        HEX[b[bs + 5]!]!;
      // Lone surrogates stay as they are; two \u escapes that form a pair join up in UTF-16.
      out += String.fromCharCode(unit);
      from = bs + 6;
    } else {
      out += SIMPLE[c]!;
      from = bs + 2;
    }
    bs = nextBackslash(b, from, e);
  }
  return out + utf8(b, from, e);
}

/** The value of the validated JSON number [s, e), exactly as JSON.parse gives it. */
export function numberValue(b: Uint8Array, s: number, e: number): number {
  if (e - s <= 15) {
    // Fast path: plain digits fit a double exactly.
    let v = 0;
    let i = s;
    for (; i < e; i++) {
      const d = b[i]! - ZERO;
      if (d < 0 || d > 9) break;
      v = v * 10 + d;
    }
    if (i === e) return v;
  }
  return Number(utf8(b, s, e));
}
