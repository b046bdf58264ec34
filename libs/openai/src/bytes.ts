// Byte values the JSON walk compares against, and the tables it looks bytes up in.

export const TAB = 0x09;
export const LF = 0x0a;
export const CR = 0x0d;
export const SPACE = 0x20;
export const QUOTE = 0x22;
export const PLUS = 0x2b;
export const COMMA = 0x2c;
export const MINUS = 0x2d;
export const DOT = 0x2e;
export const ZERO = 0x30;
export const ONE = 0x31;
export const NINE = 0x39;
export const COLON = 0x3a;
export const UPPER_E = 0x45;
export const LBRACKET = 0x5b;
export const BACKSLASH = 0x5c;
export const RBRACKET = 0x5d;
export const LOWER_E = 0x65;
export const LOWER_F = 0x66;
export const LOWER_N = 0x6e;
export const LOWER_T = 0x74;
export const LBRACE = 0x7b;
export const RBRACE = 0x7d;

/** 1 for the bytes that end a run of plain string content: controls (< 0x20), `"` and `\`. */
export const STRING_STOP = new Uint8Array(256);
for (let c = 0; c < 0x20; c++) STRING_STOP[c] = 1;
STRING_STOP[QUOTE] = 1;
STRING_STOP[BACKSLASH] = 1;

/** After a backslash: 1 for `"\/bfnrt`, 2 for `u`, 0 for anything else (invalid). */
export const ESCAPE = new Uint8Array(256);
for (const c of '"\\/bfnrt') ESCAPE[c.charCodeAt(0)] = 1;
ESCAPE[0x75] = 2;

/** Value of a hex digit, or -1. */
export const HEX = new Int8Array(256).fill(-1);
for (let d = 0; d < 10; d++) HEX[ZERO + d] = d;
for (let d = 0; d < 6; d++) {
  HEX[0x41 + d] = 10 + d;
  HEX[0x61 + d] = 10 + d;
}

/** A byte as an error message shows it: `'x'` when printable ASCII, else `byte 0x0A`. */
export function describeByte(c: number): string {
  if (c > 0x20 && c < 0x7f) return `'${String.fromCharCode(c)}'`;
  return `byte 0x${c.toString(16).toUpperCase().padStart(2, '0')}`;
}
