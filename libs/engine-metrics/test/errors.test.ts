import { describe, expect, it } from 'vitest';
import { PrometheusParseError } from '../src/index.js';
import { parseError } from './helpers.js';

/** Three good lines first, so the bad line is line 4. */
const PREFIX = '# HELP ok Fine.\nok{a="1"} 1\n\n';

describe('PrometheusParseError', () => {
  it('carries code, line and a message that names the line', () => {
    const lines = [
      '# HELP vllm:num_requests_running Number of requests in model execution batches.',
      '# TYPE vllm:num_requests_running gauge',
      ...Array.from({ length: 9 }, (_, i) => `vllm:num_requests_running{engine="${i}"} 0.0`),
      'vllm:num_requests_running{engine="0",model_name"x"} 1.0',
    ];
    const error = parseError(lines.join('\n'));
    expect(error).toBeInstanceOf(Error);
    expect(error).toBeInstanceOf(PrometheusParseError);
    expect(error.name).toBe('PrometheusParseError');
    expect(error.code).toBe('ERR_PROM_PARSE');
    expect(error.line).toBe(12);
    expect(error.message).toBe(`line 12: expected '=' after label name "model_name", found '"'`);
  });
});

describe('parseExposition: errors', () => {
  it.each([
    // [what, bad line, expected message fragment]
    ['unterminated label value', 'm{a="x} 1', 'unterminated value of label "a"'],
    ['label value cut by the end of input', 'm{a="x', 'unterminated value of label "a"'],
    ['label value ending in a backslash', 'm{a="x\\', 'unterminated value of label "a"'],
    ['escaped label value cut by a newline', 'm{a="\\"x\n"} 1', 'unterminated value of label "a"'],
    [
      'unknown escape in a label value',
      'm{a="\\t"} 1',
      `invalid escape '\\t' in the value of label "a"`,
    ],
    ['unterminated label set', 'm{a="x"', 'unterminated label set of sample "m"'],
    ['label set cut after a comma', 'm{a="x",', 'unterminated label set of sample "m"'],
    [
      'missing comma between labels',
      'm{a="x" b="y"} 1',
      `expected ',' or '}' after the value of label "a"`,
    ],
    ['missing value', 'm', 'missing value for sample "m"'],
    ['missing value after blanks', 'm \t ', 'missing value for sample "m"'],
    ['missing value after labels', 'm{a="b"}', 'missing value for sample "m"'],
    ['missing value after empty labels', 'm{} ', 'missing value for sample "m"'],
    ['garbage after the timestamp', 'm 1 2 x', `unexpected 'x' after the timestamp of sample "m"`],
    ['a second timestamp', 'm 1 2 3', `unexpected '3' after the timestamp of sample "m"`],
    ['a trailing comment', 'm 1 # note', 'invalid timestamp "#" for sample "m"'],
    ['an OpenMetrics exemplar', 'm_bucket{le="1"} 1 # {id="a"} 1', 'invalid timestamp "#"'],
    ['fractional timestamp', 'm 1 1.5', 'invalid timestamp "1.5" for sample "m"'],
    ['bare sign as timestamp', 'm 1 -', 'invalid timestamp "-"'],
    [
      'timestamp beyond 2^53',
      'm 1 9007199254740992',
      'timestamp "9007199254740992" of sample "m" is out of range',
    ],
    ['name starting with a digit', '1m 1', `expected a metric name, found '1'`],
    ['name with a dash', 'm-x 1', `invalid character '-' in metric name "m"`],
    ['name with a dot', 'm.x 1', `invalid character '.' in metric name "m"`],
    ['non-ASCII name', 'é 1', `expected a metric name, found 'é'`],
    ['quoted name (UTF-8 names are not 0.0.4)', '{"m"} 1', `expected a metric name, found '{'`],
    [
      'label name starting with a digit',
      'm{1a="x"} 1',
      `expected a label name or '}' in sample "m", found '1'`,
    ],
    ['label name with a colon', 'm{a:b="x"} 1', `expected '=' after label name "a", found ':'`],
    ['empty label name', 'm{="x"} 1', `expected a label name or '}' in sample "m", found '='`],
    ['lone comma in labels', 'm{,} 1', `expected a label name or '}' in sample "m", found ','`],
    [
      'double comma in labels',
      'm{a="x",,} 1',
      `expected a label name or '}' in sample "m", found ','`,
    ],
    ['missing equals sign', 'm{a "x"} 1', `expected '=' after label name "a", found '"'`],
    ['unquoted label value', 'm{a=x} 1', `expected '"' to open the value of label "a", found 'x'`],
    ['single-quoted label value', "m{a='x'} 1", `expected '"' to open the value of label "a"`],
    ['duplicate label', 'm{a="x",b="y",a="x"} 1', 'duplicate label "a" in sample "m"'],
    [
      'duplicate label that is an Object.prototype key',
      'm{constructor="x",constructor="y"} 1',
      'duplicate label "constructor"',
    ],
    [
      'duplicate __proto__ label',
      'm{__proto__="x",__proto__="y"} 1',
      'duplicate label "__proto__"',
    ],
    ['lone carriage return inside a line', 'm\r1', `invalid character '\\r' in metric name "m"`],
    ['carriage return after the value', 'm 1\rx', `unexpected '\\r' after the value of sample "m"`],
    [
      'control character after the value',
      'm 1\u0001',
      `unexpected '\\u0001' after the value of sample "m"`,
    ],
  ])('rejects %s', (_what, bad, fragment) => {
    const error = parseError(`${PREFIX}${bad}\nok 2\n`);
    expect(error.line).toBe(4);
    expect(error.message).toContain(`line 4: ${fragment}`);
  });

  it.each([
    '1.2.3',
    '1e',
    '1e+',
    '.',
    '+',
    '-',
    '--1',
    '+-1',
    '0x10',
    '0x1p-2',
    '1_000',
    '1,5',
    '+nan',
    '-NaN',
    'nanx',
    'in',
    'infinit',
    'infinityy',
    'Infinite',
    'e5',
    'one',
    '١',
    'true',
  ])('rejects the value %s', (value) => {
    const error = parseError(`${PREFIX}m{a="b"} ${value}\n`);
    expect(error.line).toBe(4);
    expect(error.message).toContain(
      `invalid value ${JSON.stringify(value)} for sample "m": not a float`,
    );
  });

  it.each(['1e400', '-1.8e308', '123456789e9999999999'])('rejects %s as out of range', (value) => {
    const error = parseError(`${PREFIX}m ${value}\n`);
    expect(error.line).toBe(4);
    expect(error.message).toContain(
      `invalid value "${value}" for sample "m": out of float64 range`,
    );
  });

  it('cuts a long bad token short in the message', () => {
    const error = parseError(`m ${'9'.repeat(30)}x${'9'.repeat(100)}`);
    expect(error.message).toContain('…"');
    expect(error.message.length).toBeLessThan(120);
  });
});

describe('parseExposition: HELP and TYPE errors', () => {
  it.each([
    [
      'a second TYPE line',
      '# TYPE z gauge\n# TYPE z gauge',
      'second TYPE line for metric family "z"',
    ],
    ['a second HELP line', '# HELP ok Again.', 'second HELP line for metric family "ok"'],
    [
      'TYPE after a sample of that name',
      '# TYPE ok gauge',
      'TYPE line for metric family "ok" comes after its sample "ok"',
    ],
    [
      'counter TYPE after its _total',
      'c_total 1\n# TYPE c counter',
      'TYPE line for metric family "c" comes after its sample "c_total"',
    ],
    [
      'counter TYPE after its _created',
      'c_created 1\n# TYPE c counter',
      'TYPE line for metric family "c" comes after its sample "c_created"',
    ],
    [
      'histogram TYPE after its _bucket',
      'h_bucket{le="1"} 1\n# TYPE h histogram',
      'TYPE line for metric family "h" comes after its sample "h_bucket"',
    ],
    [
      'summary TYPE after its _count',
      's_count 1\n# TYPE s summary',
      'TYPE line for metric family "s" comes after its sample "s_count"',
    ],
    [
      'gaugehistogram TYPE after its _gsum',
      'g_gsum 1\n# TYPE g gaugehistogram',
      'TYPE line for metric family "g" comes after its sample "g_gsum"',
    ],
    [
      'info TYPE after its _info',
      'i_info 1\n# TYPE i info',
      'TYPE line for metric family "i" comes after its sample "i_info"',
    ],
    ['an unknown type', '# TYPE x histo', 'unknown metric type "histo" for "x"'],
    ['an upper-case type', '# TYPE x GAUGE', 'unknown metric type "GAUGE" for "x"'],
    ['a missing type', '# TYPE x', 'missing type in # TYPE line for "x"'],
    ['a missing type after blanks', '# TYPE x  ', 'missing type in # TYPE line for "x"'],
    ['text after the type', '# TYPE x gauge extra', `unexpected 'e' after the type of "x"`],
    ['TYPE without a name', '# TYPE', 'expected a metric name after # TYPE, found end of line'],
    ['HELP without a name', '# HELP ', 'expected a metric name after # HELP, found end of line'],
    ['a bad name in TYPE', '# TYPE 1x gauge', `expected a metric name after # TYPE, found '1'`],
    [
      'a bad character in a HELP name',
      '# HELP x-y text',
      `invalid character '-' in metric name "x" of # HELP`,
    ],
    ['an unknown escape in help', '# HELP x a \\"b\\"', `invalid escape '\\"' in help text`],
    [
      'a help text ending in a backslash',
      '# HELP x tail\\',
      'help text ends with a lone backslash',
    ],
  ])('rejects %s', (_what, bad, fragment) => {
    const text = `${PREFIX}${bad}\nok 2\n`;
    const error = parseError(text);
    const badLine = 4 + bad.split('\n').length - 1;
    expect(error.line).toBe(badLine);
    expect(error.message).toContain(`line ${badLine}: ${fragment}`);
  });

  it('does not tie a sample to a family of another type by suffix', () => {
    // A gauge owns only its own name: an earlier "g_total" belongs to something else.
    expect(() => parseError('g_total 1\n# TYPE g gauge')).toThrow(
      /expected a PrometheusParseError/,
    );
  });
});

describe('parseExposition: line numbers', () => {
  it('counts \\r\\n, blank, comment and HELP lines', () => {
    const text = 'a 1\r\n\r\n# c\r\n# HELP a x\\ny\r\n  \r\nb{x="p\\nq"} 1\r\nbad{\r\n';
    expect(parseError(text).line).toBe(7);
  });

  it('reports the line where a sample starts for an unterminated label value', () => {
    const error = parseError('a 1\nb{x="open\nc 1\n');
    expect(error.line).toBe(2);
  });

  it('reports line 1 for a bad first line and the last line for a bad last line', () => {
    expect(parseError('x y').line).toBe(1);
    expect(parseError('a 1\nb 2\nc').line).toBe(3);
  });
});
