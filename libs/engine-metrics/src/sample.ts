import { LBRACE, scanMetricName } from './chars.js';
import type { Cursor } from './cursor.js';
import { describeAt, fail, isBlank, isLineEnd, quote, skipBlanks } from './cursor.js';
import { parseGoFloat } from './go-float.js';
import { readLabelSet } from './labels.js';
import { readTimestamp } from './timestamp.js';
import type { Labels, Sample } from './types.js';

/** Only consulted to word an error: a decimal that Go would still reject is out of range. */
const DECIMAL = /^[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?$/;

/** Shared by every sample without labels; frozen so no caller can change the others. */
const NO_LABELS: Labels = Object.freeze({});

/** Reads `name [{labels}] value [timestamp]` and leaves the cursor at the line end. */
export function readSample(cur: Cursor): Sample {
  const text = cur.text;
  const start = cur.pos;
  const nameEnd = scanMetricName(text, start);
  if (nameEnd === start) fail(cur, `expected a metric name, found ${describeAt(text, start)}`);
  const name = text.slice(start, nameEnd);
  cur.pos = nameEnd;
  const after = text.charCodeAt(nameEnd);
  if (!isBlank(after) && after !== LBRACE) {
    if (isLineEnd(text, nameEnd)) fail(cur, `missing value for sample "${name}"`);
    fail(cur, `invalid character ${describeAt(text, nameEnd)} in metric name "${name}"`);
  }
  skipBlanks(cur);

  let labels = NO_LABELS;
  if (text.charCodeAt(cur.pos) === LBRACE) {
    cur.pos++;
    labels = readLabelSet(cur, name);
    skipBlanks(cur);
  }
  if (isLineEnd(text, cur.pos)) fail(cur, `missing value for sample "${name}"`);

  const valueStart = cur.pos;
  const valueEnd = tokenEnd(text, valueStart);
  const value = parseGoFloat(text, valueStart, valueEnd);
  if (value === undefined) {
    const token = text.slice(valueStart, valueEnd);
    const why = DECIMAL.test(token) ? 'out of float64 range' : 'not a float';
    fail(cur, `invalid value ${quote(token)} for sample "${name}": ${why}`);
  }
  cur.pos = valueEnd;
  skipBlanks(cur);
  if (isLineEnd(text, cur.pos)) return { name, labels, value };
  if (cur.pos === valueEnd) {
    fail(cur, `unexpected ${describeAt(text, valueEnd)} after the value of sample "${name}"`);
  }

  const tsStart = cur.pos;
  const tsEnd = tokenEnd(text, tsStart);
  const timestamp = readTimestamp(cur, tsStart, tsEnd, name);
  cur.pos = tsEnd;
  skipBlanks(cur);
  if (!isLineEnd(text, cur.pos)) {
    fail(cur, `unexpected ${describeAt(text, cur.pos)} after the timestamp of sample "${name}"`);
  }
  return { name, labels, value, timestamp };
}

/** End of a value or timestamp token: the next blank, `\r`, `\n` or the end of the text. */
function tokenEnd(text: string, pos: number): number {
  let c = text.charCodeAt(pos);
  // Every byte that ends a token is below '!' (33); NaN (end of text) fails the test too.
  while (c > 32) c = text.charCodeAt(++pos);
  return pos;
}
