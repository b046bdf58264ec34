// pydantic's lax mode, for the few request fields Sluice reads. vLLM's request models
// (ChatCompletionRequest, CompletionRequest: vllm/entrypoints/openai/chat_completion/protocol.py
// and completion/protocol.py) are plain pydantic v2 models that FastAPI validates in lax mode,
// so `"max_tokens":"100"` and `"stream":"true"` reach the engine as 100 and True. The peek must
// read them the same way, or it refuses bodies vLLM serves, or gates on numbers vLLM never sees.
// Ported from pydantic-core's src/input/shared.rs (`str_as_int`, `clean_int_str`,
// `strip_leading_zeros`, `str_as_bool`, `int_as_bool`) and checked against pydantic 2.13.4 /
// pydantic-core 2.46.4 (test/lax.test.ts holds the cases, with what pydantic answered).

/** An integer as JSON writes it: what jiter's `NumberInt::try_from` accepts, the whole string. */
const JSON_INT = /^-?(?:0|[1-9][0-9]*)$/;

/**
 * Rust's `char::is_whitespace` (Unicode White_Space), which `str::trim` strips and
 * `clean_int_str` trims off: unlike JS's `trim`, U+0085 is in and U+FEFF is not.
 */
function isWhiteSpace(c: number): boolean {
  return (
    (c >= 0x09 && c <= 0x0d) ||
    c === 0x20 ||
    c === 0x85 ||
    c === 0xa0 ||
    c === 0x1680 ||
    (c >= 0x2000 && c <= 0x200a) ||
    c === 0x2028 ||
    c === 0x2029 ||
    c === 0x202f ||
    c === 0x205f ||
    c === 0x3000
  );
}

function trim(s: string): string {
  let from = 0;
  let to = s.length;
  while (from < to && isWhiteSpace(s.charCodeAt(from))) from++;
  while (to > from && isWhiteSpace(s.charCodeAt(to - 1))) to--;
  return s.slice(from, to);
}

/**
 * pydantic-core's `strip_leading_zeros`: leading zeros (and underscores among them) go, one
 * zero stays before a '.', and an all-zero string keeps its last character. Undefined when the
 * string starts with anything but a digit or '-'.
 */
function stripLeadingZeros(s: string): string | undefined {
  const first = s.charCodeAt(0);
  if (first !== 0x30 /* 0 */) {
    return (first >= 0x31 && first <= 0x39) || first === 0x2d /* - */ ? s : undefined;
  }
  for (let i = 1; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c === 0x30 || c === 0x5f /* _ */) continue;
    if ((c >= 0x31 && c <= 0x39) || c === 0x2d) return s.slice(i);
    if (c === 0x2e /* . */) return s.slice(i - 1);
    return undefined;
  }
  return s.slice(-1);
}

/**
 * pydantic-core's `clean_int_str`: trimmed, one leading '+', then one '-', leading zeros
 * stripped, a '.' followed only by zeros (at least one) dropped, single underscores between
 * digits removed. pydantic parses what comes out as a JSON integer. (pydantic-core also gives
 * up when nothing was cleaned, but then the string already failed that same parse.)
 */
function cleanIntStr(text: string): string | undefined {
  let s = trim(text);
  if (s.charCodeAt(0) === 0x2b /* + */) {
    if (s.charCodeAt(1) === 0x2d) return undefined;
    s = s.slice(1);
  }
  let sign = '';
  if (s.charCodeAt(0) === 0x2d /* - */) {
    const next = s.charCodeAt(1);
    if (next === 0x2d || next === 0x2b) return undefined;
    sign = '-';
    s = s.slice(1);
  }
  const stripped = stripLeadingZeros(s);
  if (stripped === undefined) return undefined;
  s = stripped;
  const dot = s.indexOf('.');
  if (dot >= 0 && dot + 1 < s.length && /^0+$/.test(s.slice(dot + 1))) s = s.slice(0, dot);
  // Underscores only between digits, one at a time, as in Python's int('1_000').
  if (s.includes('_') && !s.startsWith('_') && !s.endsWith('_') && !s.includes('__')) {
    s = s.replace(/_/g, '');
  }
  return sign + s;
}

/**
 * The integer pydantic's lax `int` makes of a JSON string (`str_as_int`): `"100"`,
 * `" 100 "`, `"+100"`, `"00100"`, `"100.0"`, `"1_000"`; NaN for a string it refuses
 * (`"1e2"`, `"1.5"`, `"0x10"`, `"١٠٠"`, `""`). Integers beyond 2^53 come out inexact, as
 * `Number` has them: callers refuse any value that is not a safe integer.
 */
export function strAsInt(s: string): number {
  if (JSON_INT.test(s)) return Number(s) + 0;
  const cleaned = cleanIntStr(s);
  // + 0: "-0" is 0, as in Python.
  return cleaned !== undefined && JSON_INT.test(cleaned) ? Number(cleaned) + 0 : NaN;
}

/**
 * The boolean pydantic's lax `bool` makes of a JSON string (`str_as_bool`): "0", "1", and
 * f, n, no, off, false / t, y, on, yes, true in any ASCII case; undefined for anything else
 * (no trimming: `" true"` is refused).
 */
export function strAsBool(s: string): boolean | undefined {
  if (s === '0') return false;
  if (s === '1') return true;
  // eq_ignore_ascii_case: only ASCII letters fold, so a non-ASCII string matches nothing.
  if (s.length > 5 || /[\u0080-\uffff]/.test(s)) return undefined;
  switch (s.toLowerCase()) {
    case 'f':
    case 'n':
    case 'no':
    case 'off':
    case 'false':
      return false;
    case 't':
    case 'y':
    case 'on':
    case 'yes':
    case 'true':
      return true;
    default:
      return undefined;
  }
}

/** pydantic's lax `bool` of a JSON number: 0 and 1 (0.0, 1.0, -0 …) only (`int_as_bool`). */
export function numberAsBool(v: number): boolean | undefined {
  return v === 0 ? false : v === 1 ? true : undefined;
}
