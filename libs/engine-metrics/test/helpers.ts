import { readFileSync } from 'node:fs';
import { parseExposition, PrometheusParseError } from '../src/index.js';

/** Parses `text`, expecting it to fail, and returns the error. */
export function parseError(text: string): PrometheusParseError {
  try {
    parseExposition(text);
  } catch (error) {
    if (error instanceof PrometheusParseError) return error;
    throw error;
  }
  throw new Error(`expected a PrometheusParseError for ${JSON.stringify(text)}`);
}

export function readFixture(name: string): string {
  return readFileSync(new URL(`./fixtures/${name}`, import.meta.url), 'utf8');
}

/** Escapes a label value as the text format requires. */
export function escapeLabelValue(value: string): string {
  return value.replace(/[\\"\n]/g, (c) => (c === '\n' ? '\\n' : `\\${c}`));
}

/** Escapes HELP text as the text format requires. */
export function escapeHelp(text: string): string {
  return text.replace(/[\\\n]/g, (c) => (c === '\n' ? '\\n' : '\\\\'));
}

/** A float as Python's prometheus_client writes it (floatToGoString). */
export function pythonFloat(v: number): string {
  if (v === Infinity) return '+Inf';
  if (v === -Infinity) return '-Inf';
  if (Number.isNaN(v)) return 'NaN';
  let s = Object.is(v, -0)
    ? '-0.0'
    : Number.isInteger(v) && Math.abs(v) < 1e16
      ? v.toFixed(1)
      : String(v);
  const dot = s.indexOf('.');
  if (v > 0 && dot > 6) {
    const mantissa = `${s[0]}.${s.slice(1, dot)}${s.slice(dot + 1)}`.replace(/[0.]+$/, '');
    s = `${mantissa}e+0${dot - 1}`;
  }
  return s;
}
