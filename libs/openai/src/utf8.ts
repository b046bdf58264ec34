// UTF-8 validity of a body. The check itself is Node's SIMD `isUtf8`; the byte-by-byte walk
// below runs only for a body already known to be invalid, to say where.
import { isUtf8 } from 'node:buffer';

export { isUtf8 };

/**
 * Offset of the first byte that does not belong to a well-formed UTF-8 sequence (RFC 3629:
 * no overlongs, no surrogates, nothing above U+10FFFF); -1 when the bytes are valid.
 */
export function invalidUtf8At(b: Uint8Array): number {
  const n = b.length;
  let i = 0;
  while (i < n) {
    const c = b[i]!;
    if (c < 0x80) {
      i++;
      continue;
    }
    let need: number;
    let lo = 0x80;
    let hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf) need = 1;
    else if (c >= 0xe0 && c <= 0xef) {
      need = 2;
      if (c === 0xe0) lo = 0xa0; // overlong
      if (c === 0xed) hi = 0x9f; // surrogates
    } else if (c >= 0xf0 && c <= 0xf4) {
      need = 3;
      if (c === 0xf0) lo = 0x90; // overlong
      if (c === 0xf4) hi = 0x8f; // above U+10FFFF
    } else return i;
    for (let k = 1; k <= need; k++) {
      const d = b[i + k];
      if (d === undefined || d < (k === 1 ? lo : 0x80) || d > (k === 1 ? hi : 0xbf)) return i;
    }
    i += need + 1;
  }
  return -1;
}
