import { CR, LF, SPACE, TAB } from './chars.js';
import { PrometheusParseError } from './errors.js';

/** Where the scanner stands: one object threaded through the readers. */
export interface Cursor {
  readonly text: string;
  pos: number;
  /** 1-based number of the line `pos` is on. */
  line: number;
}

export function fail(cur: Cursor, detail: string): never {
  throw new PrometheusParseError(cur.line, detail);
}

export function skipBlanks(cur: Cursor): void {
  const text = cur.text;
  let pos = cur.pos;
  let c = text.charCodeAt(pos);
  while (c === SPACE || c === TAB) c = text.charCodeAt(++pos);
  cur.pos = pos;
}

/** True at `\n`, at the end of the text, or at a `\r` that is followed by either. */
export function isLineEnd(text: string, pos: number): boolean {
  const c = text.charCodeAt(pos);
  if (c === LF || pos >= text.length) return true;
  return c === CR && (pos + 1 >= text.length || text.charCodeAt(pos + 1) === LF);
}

export function isBlank(c: number): boolean {
  return c === SPACE || c === TAB;
}

/** Human-readable name of the character at `pos`, for error messages. */
export function describeAt(text: string, pos: number): string {
  if (pos >= text.length) return 'end of input';
  if (isLineEnd(text, pos)) return 'end of line';
  const cp = text.codePointAt(pos) ?? 0;
  const char = String.fromCodePoint(cp);
  // Control characters are shown escaped ('\r', '\u0001'); everything else as itself.
  return `'${cp < 32 || cp === 127 ? JSON.stringify(char).slice(1, -1) : char}'`;
}

/** A token quoted for an error message, cut short if long. */
export function quote(token: string): string {
  return JSON.stringify(token.length > 40 ? `${token.slice(0, 40)}…` : token);
}
