import { BACKSLASH, CR, LF, LOWER_N, scanMetricName } from './chars.js';
import type { Cursor } from './cursor.js';
import { describeAt, fail, isBlank, isLineEnd, quote, skipBlanks } from './cursor.js';
import type { FamilyTable } from './families.js';
import { declareHelp, declareType, METRIC_TYPES } from './families.js';
import { escapeName } from './labels.js';
import type { MetricType } from './types.js';

/**
 * Reads a line starting with `#` and leaves the cursor at its line end. `# HELP`
 * and `# TYPE` (`#`, blanks, the keyword, a blank) are directives; any other
 * `#` line is a comment and is skipped unread.
 */
export function readCommentLine(cur: Cursor, table: FamilyTable): void {
  const text = cur.text;
  const afterHash = cur.pos + 1;
  if (isBlank(text.charCodeAt(afterHash))) {
    cur.pos = afterHash;
    skipBlanks(cur);
    const kw = cur.pos;
    const help = text.startsWith('HELP', kw);
    if ((help || text.startsWith('TYPE', kw)) && endsToken(text, kw + 4)) {
      cur.pos = kw + 4;
      const name = readDirectiveName(cur, help ? 'HELP' : 'TYPE');
      if (help) declareHelp(table, name, readHelpText(cur), cur.line);
      else declareType(table, name, readType(cur, name), cur.line);
      return;
    }
  }
  const nl = text.indexOf('\n', afterHash);
  cur.pos = nl === -1 ? text.length : nl;
}

function endsToken(text: string, pos: number): boolean {
  return isBlank(text.charCodeAt(pos)) || isLineEnd(text, pos);
}

function readDirectiveName(cur: Cursor, keyword: string): string {
  const text = cur.text;
  skipBlanks(cur);
  const start = cur.pos;
  const end = scanMetricName(text, start);
  if (end === start) {
    fail(cur, `expected a metric name after # ${keyword}, found ${describeAt(text, start)}`);
  }
  if (!endsToken(text, end)) {
    fail(
      cur,
      `invalid character ${describeAt(text, end)} in metric name "${text.slice(start, end)}" of # ${keyword}`,
    );
  }
  cur.pos = end;
  return text.slice(start, end);
}

/** The rest of the line after the blanks that follow the name; `\\` and `\n` are the escapes. */
function readHelpText(cur: Cursor): string {
  const text = cur.text;
  skipBlanks(cur);
  const start = cur.pos;
  let end = text.indexOf('\n', start);
  if (end === -1) end = text.length;
  if (end > start && text.charCodeAt(end - 1) === CR) end--;
  cur.pos = end;
  const firstEscape = text.indexOf('\\', start);
  if (firstEscape === -1 || firstEscape >= end) return text.slice(start, end);

  let out = '';
  let chunk = start;
  for (let pos = firstEscape; pos < end; pos++) {
    if (text.charCodeAt(pos) !== BACKSLASH) continue;
    out += text.slice(chunk, pos);
    const next = pos + 1 < end ? text.charCodeAt(pos + 1) : LF;
    if (next === BACKSLASH) out += '\\';
    else if (next === LOWER_N) out += '\n';
    else if (next === LF) fail(cur, 'help text ends with a lone backslash');
    else fail(cur, `invalid escape ${escapeName(text, pos + 1)} in help text`);
    pos++;
    chunk = pos + 1;
  }
  return out + text.slice(chunk, end);
}

function readType(cur: Cursor, name: string): MetricType {
  const text = cur.text;
  skipBlanks(cur);
  const start = cur.pos;
  let end = start;
  while (!isBlank(text.charCodeAt(end)) && !isLineEnd(text, end)) end++;
  const type = text.slice(start, end);
  if (type === '') fail(cur, `missing type in # TYPE line for "${name}"`);
  if (!METRIC_TYPES.has(type)) fail(cur, `unknown metric type ${quote(type)} for "${name}"`);
  cur.pos = end;
  skipBlanks(cur);
  if (!isLineEnd(text, cur.pos)) {
    fail(cur, `unexpected ${describeAt(text, cur.pos)} after the type of "${name}"`);
  }
  return type as MetricType;
}
