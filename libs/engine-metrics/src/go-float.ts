// Go's strconv.ParseFloat(s, 64), restricted to the decimal forms an exporter writes:
//   [+-] (digits [. digits*] | . digits) [(e|E) [+-] digits]
//   [+-] inf | infinity   (any case)
//   nan                   (any case, no sign)
// Hexadecimal floats and underscores (Go accepts them only with a 0x prefix) are
// rejected. A finite spelling beyond float64 range is rejected, as Go reports
// ErrRange for it.

import { DIGIT_0, DOT, isDigit, MINUS, PLUS } from './chars.js';

const E_LOWER = 101;
const E_UPPER = 69;

/** 10^0 … 10^22: every one is exact in a double, so one multiply or divide rounds once. */
const POW10 = [
  1, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16, 1e17,
  1e18, 1e19, 1e20, 1e21, 1e22,
];

/** The value of `text[start, end)` as Go would parse it, or `undefined` if Go would refuse it. */
export function parseGoFloat(text: string, start: number, end: number): number | undefined {
  let i = start;
  let c = text.charCodeAt(i);
  let negative = false;
  if (c === PLUS || c === MINUS) {
    negative = c === MINUS;
    c = text.charCodeAt(++i);
  }
  const lower = c | 0x20;
  if (lower === 0x69 /* i */) {
    const n = end - i;
    if ((n === 3 || n === 8) && matchesLower(text, i, n === 3 ? 'inf' : 'infinity')) {
      return negative ? -Infinity : Infinity;
    }
    return undefined;
  }
  if (lower === 0x6e /* n */) {
    return i === start && end - i === 3 && matchesLower(text, i, 'nan') ? NaN : undefined;
  }

  // Mantissa. Up to 15 significant digits fit a double exactly (Clinger's fast path).
  let mantissa = 0;
  let digits = 0;
  let significant = 0;
  let fraction = 0;
  while (i < end && isDigit(c)) {
    if (significant > 0 || c !== DIGIT_0) {
      mantissa = mantissa * 10 + (c - DIGIT_0);
      significant++;
    }
    digits++;
    c = text.charCodeAt(++i);
  }
  if (i < end && c === DOT) {
    c = text.charCodeAt(++i);
    while (i < end && isDigit(c)) {
      if (significant > 0 || c !== DIGIT_0) {
        mantissa = mantissa * 10 + (c - DIGIT_0);
        significant++;
      }
      fraction++;
      digits++;
      c = text.charCodeAt(++i);
    }
  }
  if (digits === 0) return undefined;

  let exponent = 0;
  if (i < end && (c === E_LOWER || c === E_UPPER)) {
    c = text.charCodeAt(++i);
    let expNegative = false;
    if (c === PLUS || c === MINUS) {
      expNegative = c === MINUS;
      c = text.charCodeAt(++i);
    }
    let expDigits = 0;
    while (i < end && isDigit(c)) {
      // Saturate: anything this large overflows or underflows anyway.
      if (exponent < 100_000) exponent = exponent * 10 + (c - DIGIT_0);
      expDigits++;
      c = text.charCodeAt(++i);
    }
    if (expDigits === 0) return undefined;
    if (expNegative) exponent = -exponent;
  }
  if (i !== end) return undefined;

  let value: number;
  const scale = exponent - fraction;
  if (significant <= 15 && scale >= -22 && scale <= 22) {
    value = scale < 0 ? mantissa / POW10[-scale]! : mantissa * POW10[scale]!;
    if (negative) value = -value;
  } else {
    value = Number(text.slice(start, end));
    if (value === Infinity || value === -Infinity) return undefined;
  }
  return value;
}

function matchesLower(text: string, pos: number, word: string): boolean {
  for (let k = 0; k < word.length; k++) {
    if ((text.charCodeAt(pos + k) | 0x20) !== word.charCodeAt(k)) return false;
  }
  return true;
}
