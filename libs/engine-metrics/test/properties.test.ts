import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import type { Sample } from '../src/index.js';
import { parseExposition, PrometheusParseError } from '../src/index.js';
import { escapeHelp, escapeLabelValue, parseError, pythonFloat } from './helpers.js';

const METRIC_HEAD = [...'abcxyzABCXYZ_:'];
const METRIC_TAIL = [...'abcxyzABCXYZ_:0189'];
const LABEL_HEAD = [...'abcxyzABCXYZ_'];
const LABEL_TAIL = [...'abcxyzABCXYZ_0189'];

const name = (head: string[], tail: string[]) =>
  fc
    .tuple(fc.constantFrom(...head), fc.string({ unit: fc.constantFrom(...tail), maxLength: 12 }))
    .map(([h, t]) => h + t);

const metricName = fc.oneof(
  name(METRIC_HEAD, METRIC_TAIL),
  fc.constantFrom('vllm:num_requests_running', 'vllm:kv_cache_usage_perc', 'h_bucket', 'c_created'),
);
const labelName = fc.oneof(
  name(LABEL_HEAD, LABEL_TAIL),
  fc.constantFrom('le', 'engine', 'model_name', '__proto__', 'constructor', 'hasOwnProperty'),
);
/** Label values lean on the characters that need escaping or could end a token. */
const tricky = fc.constantFrom(
  '"',
  '\\',
  '\n',
  '\r',
  '\t',
  ' ',
  '{',
  '}',
  ',',
  '=',
  '#',
  'n',
  '\\n',
);
const labelValue = fc.string({
  unit: fc.oneof(tricky, fc.string({ unit: 'binary', minLength: 1, maxLength: 1 })),
  maxLength: 16,
});

const value = fc.oneof(
  fc.double(),
  fc.constantFrom(NaN, Infinity, -Infinity, 0, -0, 1, 0.1, 1764300000.123),
  fc.integer({ min: -1e9, max: 1e9 }),
);

/** The ways an exporter may spell a value: Go, Python prometheus_client, exponent, odd specials. */
const spell = fc.constantFrom(
  (v: number) =>
    Object.is(v, -0)
      ? '-0'
      : Number.isNaN(v)
        ? 'NaN'
        : v === Infinity
          ? '+Inf'
          : v === -Infinity
            ? '-Inf'
            : String(v),
  pythonFloat,
  (v: number) =>
    Number.isFinite(v) ? (Object.is(v, -0) ? '-0e0' : v.toExponential()) : pythonFloat(v),
  (v: number) =>
    Number.isNaN(v)
      ? 'nan'
      : v === Infinity
        ? 'Infinity'
        : v === -Infinity
          ? '-inf'
          : pythonFloat(v),
);

const blank = fc.constantFrom(' ', '\t', '  ', ' \t ');
const maybeBlank = fc.constantFrom('', ' ', '\t');

const sample = fc.record({
  name: metricName,
  labels: fc.uniqueArray(fc.tuple(labelName, labelValue), {
    selector: ([n]) => n,
    maxLength: 5,
  }),
  value,
  timestamp: fc.option(fc.maxSafeInteger(), { nil: undefined }),
});

const layout = fc.record({
  spell,
  sep: blank,
  inner: maybeBlank,
  trailingComma: fc.boolean(),
  emptyBraces: fc.boolean(),
  plusTimestamp: fc.boolean(),
  trailingBlank: maybeBlank,
});

type GenSample = { name: string; labels: [string, string][]; value: number; timestamp?: number };
type Layout = typeof layout extends fc.Arbitrary<infer T> ? T : never;

function writeSample(s: GenSample, l: Layout): string {
  const pairs = s.labels.map(
    ([k, v]) => `${l.inner}${k}${l.inner}=${l.inner}"${escapeLabelValue(v)}"${l.inner}`,
  );
  let labels = '';
  if (pairs.length > 0) labels = `{${pairs.join(',')}${l.trailingComma ? ',' : ''}}`;
  else if (l.emptyBraces) labels = `{${l.inner}}`;
  let line = `${s.name}${labels}${l.sep}${l.spell(s.value)}`;
  if (s.timestamp !== undefined) {
    line += `${l.sep}${l.plusTimestamp && s.timestamp >= 0 ? '+' : ''}${s.timestamp}`;
  }
  return line + l.trailingBlank;
}

function expected(s: GenSample): Sample {
  const base = { name: s.name, labels: Object.fromEntries(s.labels), value: s.value };
  return s.timestamp === undefined ? base : { ...base, timestamp: s.timestamp };
}

const exposition = fc.record({
  lines: fc.array(
    fc.oneof(
      {
        weight: 6,
        arbitrary: fc.tuple(sample, layout).map(([s, l]) => ({ s, text: writeSample(s, l) })),
      },
      {
        weight: 1,
        arbitrary: fc
          .constantFrom('', '# a comment', '#', '  ', '# HELPER')
          .map((text) => ({ s: undefined, text })),
      },
    ),
    { maxLength: 20 },
  ),
  eol: fc.constantFrom('\n', '\r\n'),
  finalEol: fc.boolean(),
});

function join(lines: { text: string }[], eol: string, finalEol: boolean): string {
  return lines.map((l) => l.text).join(eol) + (finalEol && lines.length > 0 ? eol : '');
}

describe('properties', () => {
  it('reads back any samples written in the text format', () => {
    fc.assert(
      fc.property(exposition, ({ lines, eol, finalEol }) => {
        const text = join(lines, eol, finalEol);
        const want = lines.flatMap((l) => (l.s ? [expected(l.s)] : []));
        expect(parseExposition(text).samples).toEqual(want);
      }),
      { numRuns: 500 },
    );
  });

  it('reads back any help text written in the text format', () => {
    const help = fc
      .string({
        unit: fc.oneof(tricky, fc.string({ unit: 'binary', minLength: 1, maxLength: 1 })),
        maxLength: 40,
      })
      // The blanks after the name and a \r before the line end are not part of the help.
      .filter((h) => !/^[ \t]/.test(h) && !h.endsWith('\r'));
    fc.assert(
      fc.property(metricName, help, fc.constantFrom('\n', '\r\n', ''), (n, h, eol) => {
        const text = `# HELP ${n} ${escapeHelp(h)}${eol}`;
        expect(parseExposition(text).families.get(n)).toEqual({
          name: n,
          type: 'untyped',
          help: h,
        });
      }),
      { numRuns: 500 },
    );
  });

  it('reports the line of a broken sample, whatever surrounds it', () => {
    const broken = fc.constantFrom(
      'm{a="x} 1',
      'm 1.2.3',
      'm',
      'm 1 2 x',
      '1m 1',
      'm{1a="b"} 1',
      'm{a="b",a="b"} 1',
      'm{a="\\q"} 1',
      '# TYPE m nonsense',
    );
    fc.assert(
      fc.property(exposition, broken, fc.nat(), ({ lines, eol }, bad, at) => {
        const k = lines.length === 0 ? 0 : at % (lines.length + 1);
        const texts = lines.map((l) => l.text);
        texts.splice(k, 0, bad);
        const error = parseError(texts.join(eol));
        // Label values may hold escaped newlines but never raw ones, so line k+1 is the bad one.
        expect(error.line).toBe(k + 1);
        expect(error.message.startsWith(`line ${k + 1}: `)).toBe(true);
      }),
      { numRuns: 300 },
    );
  });

  it('either parses or throws PrometheusParseError for arbitrary input', () => {
    const unit = fc.oneof(
      fc.constantFrom(
        ...'am:_1.eE+-{}"\\=, \t\n\r#',
        'NaN',
        'Inf',
        '# HELP ',
        '# TYPE ',
        ' counter',
        ' histogram',
        'le="+Inf"',
      ),
      fc.string({ unit: 'binary', minLength: 1, maxLength: 1 }),
    );
    fc.assert(
      fc.property(fc.string({ unit, maxLength: 60 }), (text) => {
        const lineCount = text.split('\n').length;
        try {
          const result = parseExposition(text);
          for (const s of result.samples) {
            expect(s.name).toMatch(/^[a-zA-Z_:][a-zA-Z0-9_:]*$/);
            expect(typeof s.value).toBe('number');
          }
        } catch (error) {
          expect(error).toBeInstanceOf(PrometheusParseError);
          const line = (error as PrometheusParseError).line;
          expect(line).toBeGreaterThanOrEqual(1);
          expect(line).toBeLessThanOrEqual(lineCount);
        }
      }),
      { numRuns: 3000 },
    );
  });
});
