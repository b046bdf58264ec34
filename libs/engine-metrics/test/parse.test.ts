import { describe, expect, it } from 'vitest';
import { parseExposition } from '../src/index.js';

function only(text: string) {
  const { samples } = parseExposition(text);
  expect(samples).toHaveLength(1);
  return samples[0]!;
}

describe('parseExposition: samples', () => {
  it('reads a name, labels and a value', () => {
    expect(only('vllm:num_requests_running{engine="0",model_name="m"} 12.0\n')).toEqual({
      name: 'vllm:num_requests_running',
      labels: { engine: '0', model_name: 'm' },
      value: 12,
    });
  });

  it('keeps samples in input order', () => {
    const { samples } = parseExposition('b 2\na 1\nc 3\na 4\n');
    expect(samples.map((s) => [s.name, s.value])).toEqual([
      ['b', 2],
      ['a', 1],
      ['c', 3],
      ['a', 4],
    ]);
  });

  it('reads labels in any order', () => {
    const a = only('m{a="1",b="2",c="3"} 1');
    const b = only('m{c="3",a="1",b="2"} 1');
    expect(a.labels).toEqual({ a: '1', b: '2', c: '3' });
    expect(b.labels).toEqual(a.labels);
    expect(Object.keys(b.labels)).toEqual(['c', 'a', 'b']);
  });

  it('unescapes \\\\, \\" and \\n in label values', () => {
    const s = only('m{path="C:\\\\dir\\\\",say="he said \\"hi\\"",two="a\\nb",mix="\\\\n"} 1');
    expect(s.labels).toEqual({ path: 'C:\\dir\\', say: 'he said "hi"', two: 'a\nb', mix: '\\n' });
  });

  it('keeps label values verbatim otherwise, including braces, commas, # and non-ASCII', () => {
    const s = only('m{a="x,y}=z # {q}",b="Llama-3.1 ✓ 模型 🦙",c="",d="\ttab\r"} 1');
    expect(s.labels).toEqual({ a: 'x,y}=z # {q}', b: 'Llama-3.1 ✓ 模型 🦙', c: '', d: '\ttab\r' });
  });

  it('allows a trailing comma, blanks inside the braces and empty braces', () => {
    expect(only('m{a="1",} 1').labels).toEqual({ a: '1' });
    expect(only('m{ a = "1" ,\tb="2" , } 1').labels).toEqual({ a: '1', b: '2' });
    expect(only('m{} 1').labels).toEqual({});
    expect(only('m { } 1').labels).toEqual({});
    expect(only('m {a="1"} 1').labels).toEqual({ a: '1' });
  });

  it('allows the value right after the closing brace', () => {
    expect(only('m{a="1"}2')).toEqual({ name: 'm', labels: { a: '1' }, value: 2 });
  });

  it('gives samples without labels one frozen empty label object', () => {
    const { samples } = parseExposition('a 1\nb 2\n');
    expect(samples[0]!.labels).toEqual({});
    expect(Object.isFrozen(samples[0]!.labels)).toBe(true);
    expect(samples[1]!.labels).toBe(samples[0]!.labels);
  });

  it('stores __proto__ and constructor as ordinary labels', () => {
    const s = only('m{__proto__="p",constructor="c",toString="t"} 1');
    expect(Object.keys(s.labels)).toEqual(['__proto__', 'constructor', 'toString']);
    expect(Object.getOwnPropertyDescriptor(s.labels, '__proto__')?.value).toBe('p');
    expect(Object.getPrototypeOf(s.labels)).toBe(Object.prototype);
    expect(s.labels['constructor']).toBe('c');
  });

  it('accepts metric names with colons and underscores anywhere', () => {
    const names = ['vllm:kv_cache_usage_perc', ':a', '_', '__x:y:_1', 'A9'];
    const { samples } = parseExposition(names.map((n) => `${n} 1`).join('\n'));
    expect(samples.map((s) => s.name)).toEqual(names);
  });

  it('treats _created, _total, _bucket, _sum and _count as ordinary samples', () => {
    const text = [
      '# TYPE h histogram',
      'h_bucket{le="0.5"} 1.0',
      'h_bucket{le="+Inf"} 2.0',
      'h_count 2.0',
      'h_sum 0.75',
      'h_created 1.7643e+09',
      'c_total 5.0',
    ].join('\n');
    const { samples } = parseExposition(text);
    expect(samples.map((s) => s.name)).toEqual([
      'h_bucket',
      'h_bucket',
      'h_count',
      'h_sum',
      'h_created',
      'c_total',
    ]);
    expect(samples[1]!.labels).toEqual({ le: '+Inf' });
    expect(samples[4]!.value).toBe(1.7643e9);
  });
});

describe('parseExposition: values and timestamps', () => {
  it.each([
    ['0.0', 0],
    ['1', 1],
    ['-0', -0],
    ['-0.0', -0],
    ['1.', 1],
    ['.5', 0.5],
    ['+.5', 0.5],
    ['007', 7],
    ['1e3', 1000],
    ['1E-3', 0.001],
    ['+2.5e+2', 250],
    ['1.7643e+09', 1764300000],
    ['1.2345678901e+010', 12345678901],
    ['0.1', 0.1],
    ['3.0000000000000004', 3.0000000000000004],
    ['1.7976931348623157e308', Number.MAX_VALUE],
    ['5e-324', Number.MIN_VALUE],
    ['1e-400', 0],
    ['123456789012345678901234567890', 1.2345678901234568e29],
  ])('reads the decimal %s', (text, value) => {
    expect(Object.is(only(`m ${text}`).value, value)).toBe(true);
  });

  it.each([
    ['NaN', NaN],
    ['nan', NaN],
    ['NAN', NaN],
    ['+Inf', Infinity],
    ['Inf', Infinity],
    ['inf', Infinity],
    ['+INF', Infinity],
    ['Infinity', Infinity],
    ['+infinity', Infinity],
    ['-Inf', -Infinity],
    ['-inf', -Infinity],
    ['-Infinity', -Infinity],
  ])('reads the special value %s', (text, value) => {
    expect(only(`m{le="${text}"} ${text}`).value).toBe(value);
  });

  it('reads an optional millisecond timestamp, which may be negative', () => {
    expect(only('m 1 1712345678901')).toEqual({
      name: 'm',
      labels: {},
      value: 1,
      timestamp: 1712345678901,
    });
    expect(only('m{a="b"} 2.5 -1000').timestamp).toBe(-1000);
    expect(only('m 2.5 +7').timestamp).toBe(7);
    expect(Object.is(only('m 2.5 -0').timestamp, 0)).toBe(true);
    expect(only(`m 1 ${Number.MAX_SAFE_INTEGER}`).timestamp).toBe(Number.MAX_SAFE_INTEGER);
  });

  it('leaves timestamp out when the line has none', () => {
    expect('timestamp' in only('m 1')).toBe(false);
    expect('timestamp' in only('m 1 \t')).toBe(false);
  });

  it('allows blanks and tabs between tokens and at either end of a line', () => {
    expect(only(' \t m\t{a="1"}\t 3 \t 42 \t')).toEqual({
      name: 'm',
      labels: { a: '1' },
      value: 3,
      timestamp: 42,
    });
  });
});

describe('parseExposition: lines', () => {
  it('ignores blank lines, blank-only lines and comments', () => {
    const text = [
      '',
      '# a comment',
      '#no blank after the hash',
      '#',
      '   # indented comment',
      '# HELPER is not HELP',
      '# TYPE_ is not TYPE',
      '# help lower-case is a comment',
      '# EOF',
      '  \t ',
      'm 1',
      '',
    ].join('\n');
    const result = parseExposition(text);
    expect(result.samples).toEqual([{ name: 'm', labels: {}, value: 1 }]);
    expect(result.families.size).toBe(0);
  });

  it('reads a last line without a newline', () => {
    expect(parseExposition('a 1\nb 2').samples.map((s) => s.value)).toEqual([1, 2]);
    expect(parseExposition('# HELP a text').families.get('a')?.help).toBe('text');
  });

  it('returns nothing for empty or comment-only input', () => {
    for (const text of ['', '\n', '\n\n', '# only\n', '\r\n']) {
      const result = parseExposition(text);
      expect(result.samples).toEqual([]);
      expect(result.families.size).toBe(0);
    }
  });

  it('reads \\r\\n line endings like \\n', () => {
    const lf = '# HELP a Help.\n# TYPE a gauge\na{b="c"} 1 5\n\nb 2\n';
    const crlf = lf.replace(/\n/g, '\r\n');
    const a = parseExposition(lf);
    const b = parseExposition(crlf);
    expect(b.samples).toEqual(a.samples);
    expect(b.families).toEqual(a.families);
    expect(b.families.get('a')?.help).toBe('Help.');
    expect(parseExposition('a 1\r').samples).toEqual([{ name: 'a', labels: {}, value: 1 }]);
  });
});

describe('parseExposition: HELP and TYPE', () => {
  it('records families from TYPE and HELP lines', () => {
    const text = [
      '# HELP vllm:num_requests_running Number of requests in model execution batches.',
      '# TYPE vllm:num_requests_running gauge',
      'vllm:num_requests_running{engine="0"} 3.0',
    ].join('\n');
    expect([...parseExposition(text).families.values()]).toEqual([
      {
        name: 'vllm:num_requests_running',
        type: 'gauge',
        help: 'Number of requests in model execution batches.',
      },
    ]);
  });

  it('accepts every type, in either order with HELP', () => {
    const types = [
      'counter',
      'gauge',
      'histogram',
      'summary',
      'untyped',
      'info',
      'stateset',
      'gaugehistogram',
      'unknown',
    ] as const;
    const text = types.map((t, i) => `# TYPE f${i} ${t}\n# HELP f${i} h${i}`).join('\n');
    const families = parseExposition(text).families;
    expect(types.map((t, i) => families.get(`f${i}`))).toEqual(
      types.map((type, i) => ({ name: `f${i}`, type, help: `h${i}` })),
    );
  });

  it('calls a family with only a HELP line untyped, and lets a TYPE line follow', () => {
    expect(parseExposition('# HELP a x').families.get('a')).toEqual({
      name: 'a',
      type: 'untyped',
      help: 'x',
    });
    expect(parseExposition('# HELP a x\n# TYPE a counter').families.get('a')?.type).toBe('counter');
  });

  it('leaves help undefined without a HELP line', () => {
    const family = parseExposition('# TYPE a gauge').families.get('a');
    expect(family).toEqual({ name: 'a', type: 'gauge' });
    expect(family && 'help' in family).toBe(false);
  });

  it('unescapes \\\\ and \\n in help text and keeps everything else', () => {
    const text = '# HELP a one\\\\two\\nthree "quoted" {x="y"} \t ';
    expect(parseExposition(text).families.get('a')?.help).toBe(
      'one\\two\nthree "quoted" {x="y"} \t ',
    );
  });

  it('skips the blanks before help text, and allows empty help', () => {
    expect(parseExposition('# HELP a  \t spaced').families.get('a')?.help).toBe('spaced');
    expect(parseExposition('# HELP a').families.get('a')?.help).toBe('');
    expect(parseExposition('# HELP a \n').families.get('a')?.help).toBe('');
  });

  it('allows blanks around the keyword and a trailing blank after the type', () => {
    const families = parseExposition('#\t TYPE\ta \tcounter \t\n  # HELP b x').families;
    expect(families.get('a')?.type).toBe('counter');
    expect(families.get('b')?.help).toBe('x');
  });

  it('allows a TYPE line for a family after samples of other families', () => {
    const text = 'a_total 1\n# TYPE b counter\nb_total 2\n# TYPE a_created gauge\na_created 3';
    const result = parseExposition(text);
    expect(result.samples).toHaveLength(3);
    expect(result.families.get('a_created')?.type).toBe('gauge');
  });

  it('allows a HELP line after samples of its family', () => {
    expect(parseExposition('a 1\n# HELP a late').families.get('a')?.help).toBe('late');
  });
});
