import { BACKSLASH, COMMA, EQUALS, LF, LOWER_N, QUOTE, RBRACE, scanLabelName } from './chars.js';
import type { Cursor } from './cursor.js';
import { describeAt, fail, isLineEnd, skipBlanks } from './cursor.js';

/**
 * Reads a label set after its `{`, up to and including the `}`. Blanks may stand
 * between any two tokens; a trailing comma and the empty set `{}` are allowed.
 */
export function readLabelSet(cur: Cursor, metricName: string): Record<string, string> {
  const text = cur.text;
  const labels: Record<string, string> = {};
  for (;;) {
    skipBlanks(cur);
    const start = cur.pos;
    if (text.charCodeAt(start) === RBRACE) {
      cur.pos = start + 1;
      return labels;
    }
    const nameEnd = scanLabelName(text, start);
    if (nameEnd === start) {
      if (isLineEnd(text, start)) fail(cur, `unterminated label set of sample "${metricName}"`);
      fail(
        cur,
        `expected a label name or '}' in sample "${metricName}", found ${describeAt(text, start)}`,
      );
    }
    const name = text.slice(start, nameEnd);
    cur.pos = nameEnd;
    skipBlanks(cur);
    if (text.charCodeAt(cur.pos) !== EQUALS) {
      fail(cur, `expected '=' after label name "${name}", found ${describeAt(text, cur.pos)}`);
    }
    cur.pos++;
    skipBlanks(cur);
    if (text.charCodeAt(cur.pos) !== QUOTE) {
      fail(
        cur,
        `expected '"' to open the value of label "${name}", found ${describeAt(text, cur.pos)}`,
      );
    }
    cur.pos++;
    const value = readLabelValue(cur, name);
    if (Object.hasOwn(labels, name)) {
      fail(cur, `duplicate label "${name}" in sample "${metricName}"`);
    }
    if (name === '__proto__') {
      // A plain assignment would set the object's prototype instead.
      Object.defineProperty(labels, name, {
        value,
        enumerable: true,
        writable: true,
        configurable: true,
      });
    } else {
      labels[name] = value;
    }
    skipBlanks(cur);
    const c = text.charCodeAt(cur.pos);
    if (c === COMMA) {
      cur.pos++;
    } else if (c === RBRACE) {
      cur.pos++;
      return labels;
    } else if (isLineEnd(text, cur.pos)) {
      fail(cur, `unterminated label set of sample "${metricName}"`);
    } else {
      fail(
        cur,
        `expected ',' or '}' after the value of label "${name}", found ${describeAt(text, cur.pos)}`,
      );
    }
  }
}

/**
 * Reads a label value after its opening quote, up to and including the closing one.
 * A value without escapes is sliced straight from the text.
 */
export function readLabelValue(cur: Cursor, labelName: string): string {
  const text = cur.text;
  const start = cur.pos;
  let pos = start;
  for (;;) {
    const c = text.charCodeAt(pos);
    if (c === QUOTE) {
      cur.pos = pos + 1;
      return text.slice(start, pos);
    }
    if (c === BACKSLASH) return readEscapedLabelValue(cur, start, pos, labelName);
    // c !== c: charCodeAt past the end is NaN.
    if (c === LF || c !== c) fail(cur, `unterminated value of label "${labelName}"`);
    pos++;
  }
}

/** The slow path, from the first backslash on: `\\`, `\"` and `\n` are the only escapes. */
function readEscapedLabelValue(cur: Cursor, start: number, backslash: number, labelName: string) {
  const text = cur.text;
  let out = text.slice(start, backslash);
  let pos = backslash;
  let chunk = pos;
  for (;;) {
    const c = text.charCodeAt(pos);
    if (c === QUOTE) {
      cur.pos = pos + 1;
      return out + text.slice(chunk, pos);
    }
    if (c === BACKSLASH) {
      out += text.slice(chunk, pos);
      out += unescapeLabelChar(cur, pos + 1, labelName);
      pos += 2;
      chunk = pos;
      continue;
    }
    if (c === LF || c !== c) fail(cur, `unterminated value of label "${labelName}"`);
    pos++;
  }
}

/** `'\x'` for the escape whose second character is at `pos`. */
export function escapeName(text: string, pos: number): string {
  return `'\\${String.fromCodePoint(text.codePointAt(pos) ?? 0)}'`;
}

/** What the escape whose second character is at `pos` stands for. */
function unescapeLabelChar(cur: Cursor, pos: number, labelName: string): string {
  const next = cur.text.charCodeAt(pos);
  if (next === BACKSLASH) return '\\';
  if (next === QUOTE) return '"';
  if (next === LOWER_N) return '\n';
  if (next === LF || next !== next) fail(cur, `unterminated value of label "${labelName}"`);
  return fail(
    cur,
    `invalid escape ${escapeName(cur.text, pos)} in the value of label "${labelName}"`,
  );
}
