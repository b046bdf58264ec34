// Character codes and classes for a charCodeAt scanner. Everything outside ASCII
// is "no class", so non-ASCII names are rejected without a special case.

export const TAB = 9;
export const LF = 10;
export const CR = 13;
export const SPACE = 32;
export const QUOTE = 34;
export const HASH = 35;
export const PLUS = 43;
export const COMMA = 44;
export const MINUS = 45;
export const DOT = 46;
export const DIGIT_0 = 48;
export const DIGIT_9 = 57;
export const EQUALS = 61;
export const BACKSLASH = 92;
export const LOWER_N = 110;
export const LBRACE = 123;
export const RBRACE = 125;

const METRIC_START = 1; // [a-zA-Z_:]
const METRIC_PART = 2; // [a-zA-Z0-9_:]
const LABEL_START = 4; // [a-zA-Z_]
const LABEL_PART = 8; // [a-zA-Z0-9_]

const CLASS = new Uint8Array(128);
for (let c = 0; c < 128; c++) {
  const letter = (c >= 65 && c <= 90) || (c >= 97 && c <= 122) || c === 95;
  const digit = c >= DIGIT_0 && c <= DIGIT_9;
  const colon = c === 58;
  CLASS[c] =
    (letter || colon ? METRIC_START : 0) |
    (letter || digit || colon ? METRIC_PART : 0) |
    (letter ? LABEL_START : 0) |
    (letter || digit ? LABEL_PART : 0);
}

/** End of the metric name `[a-zA-Z_:][a-zA-Z0-9_:]*` starting at `pos`; `pos` itself if none. */
export function scanMetricName(text: string, pos: number): number {
  if (((CLASS[text.charCodeAt(pos)] ?? 0) & METRIC_START) === 0) return pos;
  let i = pos + 1;
  while (((CLASS[text.charCodeAt(i)] ?? 0) & METRIC_PART) !== 0) i++;
  return i;
}

/** End of the label name `[a-zA-Z_][a-zA-Z0-9_]*` starting at `pos`; `pos` itself if none. */
export function scanLabelName(text: string, pos: number): number {
  if (((CLASS[text.charCodeAt(pos)] ?? 0) & LABEL_START) === 0) return pos;
  let i = pos + 1;
  while (((CLASS[text.charCodeAt(i)] ?? 0) & LABEL_PART) !== 0) i++;
  return i;
}

export function isDigit(c: number): boolean {
  return c >= DIGIT_0 && c <= DIGIT_9;
}
