import fc from 'fast-check';
import type { JsonValue } from 'fast-check';

/** A number written exactly as given (e.g. `1e2`, `-0`, `100.0`), which JSON.stringify can't. */
export class RawNumber {
  constructor(readonly text: string) {}
}

/** What serialize() writes: JSON, numbers spelled as given, and Members at any depth. */
export type Value = JsonValue | RawNumber | Members | Value[] | { [key: string]: Value };

/** Choices the serializer cycles through: whitespace between tokens, and which chars to escape. */
export interface Style {
  readonly ws: readonly string[];
  readonly escape: readonly boolean[];
}

export const style: fc.Arbitrary<Style> = fc.record({
  ws: fc.array(fc.constantFrom('', '', '', ' ', '\n', '\t', '\r\n', '  ', ' \n    '), {
    minLength: 1,
    maxLength: 8,
  }),
  escape: fc.array(fc.boolean(), { minLength: 1, maxLength: 8 }),
});

const SHORT: Record<string, string> = {
  '"': '\\"',
  '\\': '\\\\',
  '\b': '\\b',
  '\f': '\\f',
  '\n': '\\n',
  '\r': '\\r',
  '\t': '\\t',
};

const hex4 = (unit: number) => `\\u${unit.toString(16).padStart(4, '0')}`;

/**
 * JSON text for `value`, with whitespace and optional escapes drawn from `s` in turn; object
 * members come as [key, value] pairs so that duplicate keys can be written.
 */
export function serialize(value: Value | Members, s: Style): string {
  let w = 0;
  let e = 0;
  const ws = () => s.ws[w++ % s.ws.length]!;
  const esc = () => s.escape[e++ % s.escape.length]!;
  const str = (text: string): string => {
    let out = '"';
    for (let k = 0; k < text.length; k++) {
      const ch = text[k]!;
      const unit = text.charCodeAt(k);
      if (SHORT[ch] !== undefined) out += esc() && unit >= 0x20 ? hex4(unit) : SHORT[ch];
      else if (unit < 0x20) out += hex4(unit);
      else if (esc()) out += ch === '/' ? '\\/' : hex4(unit);
      else out += ch;
    }
    return `${out}"`;
  };
  const go = (v: Value | Members): string => {
    if (v instanceof Members) {
      const inner = v.entries.map(([k, x]) => `${ws()}${str(k)}${ws()}:${ws()}${go(x)}${ws()}`);
      return `{${inner.length ? inner.join(',') : ws()}}`;
    }
    if (v instanceof RawNumber) return v.text;
    if (v === null || typeof v === 'boolean' || typeof v === 'number') return JSON.stringify(v);
    if (typeof v === 'string') return str(v);
    if (Array.isArray(v))
      return `[${v.length ? v.map((x) => ws() + go(x) + ws()).join(',') : ws()}]`;
    return go(new Members(Object.entries(v) as [string, Value][]));
  };
  return ws() + go(value) + ws();
}

/** An object written member by member, in this order, duplicates allowed. */
export class Members {
  constructor(readonly entries: readonly (readonly [string, Value])[]) {}
}

export const anyString = fc.oneof(
  fc.string(),
  fc.string({ unit: 'binary', maxLength: 20 }),
  fc.constantFrom('', 'gpt-4o', 'meta-llama/Llama-3.1-8B-Instruct', 'café-模型-😀', '\u2028'),
);
const json = fc.jsonValue({ maxDepth: 3 });
/**
 * Strings in an int field: integers as pydantic's lax mode takes them (padded, signed, with
 * underscores or a zero fraction), and near misses it refuses.
 */
export const laxIntString: fc.Arbitrary<Value> = fc.oneof(
  fc.nat(100_000).map(String),
  fc
    .tuple(
      fc.constantFrom('', ' ', '\t', '\n ', '\u00a0', '\u2003', '\ufeff'),
      fc.constantFrom('', '+', '-', '0', '00', '+0'),
      fc.nat(100_000),
      fc.constantFrom('', '.0', '.00', '.', '.5', 'e2', '_0', '__0', '_'),
      fc.constantFrom('', ' ', '\r\n', '\u0085', 'x'),
    )
    .map(([lead, sign, v, tail, trail]) => `${lead}${sign}${v}${tail}${trail}`),
  fc.constantFrom('', ' ', '1_000', '0x10', '1e2', '9007199254740992', 'true', 'null', '٣'),
);
/** Strings in a bool field: words pydantic's lax mode takes in any case, and near misses. */
export const laxBoolString: fc.Arbitrary<Value> = fc
  .tuple(
    fc.constantFrom('0', '1', 't', 'f', 'y', 'n', 'on', 'no', 'off', 'yes', 'true', 'false'),
    fc.constantFrom('', '', 'upper', 'capital', ' ', 'x'),
  )
  .map(([word, how]) =>
    how === 'upper'
      ? word.toUpperCase()
      : how === 'capital'
        ? word.charAt(0).toUpperCase() + word.slice(1)
        : how === ' '
          ? ` ${word}`
          : word + how,
  );
const tokenNumber = fc.oneof(
  fc.nat(100_000).map((v) => v as Value),
  fc
    .constantFrom(
      '1e2',
      '100.0',
      '1E+2',
      '-0',
      '0',
      '0.5e1',
      '1.5',
      '-1',
      '1e400',
      '9007199254740993',
    )
    .map((t) => new RawNumber(t) as Value),
  fc.integer({ min: -5, max: 5 }),
  fc.double(),
  // as strings and booleans, which vLLM's lax pydantic reads as integers (or refuses)
  laxIntString,
  fc.boolean(),
);
export const message = fc.record({
  role: fc.constantFrom('system', 'user', 'assistant', 'tool'),
  content: fc.oneof(anyString, fc.array(fc.record({ type: fc.constant('text'), text: anyString }))),
});

/** A tool definition as OpenAI's `tools` has it; it serves as a RAG `documents` entry too (any object). */
const functionDefinition = fc.record(
  { name: anyString, description: anyString, parameters: fc.jsonValue({ maxDepth: 2 }) },
  { requiredKeys: ['name'] },
);
const toolDefinition = fc.record({ type: fc.constant('function'), function: functionDefinition });

/** Candidate values of each field Sluice reads: mostly the right type, sometimes not. */
const fieldValues: Record<string, fc.Arbitrary<Value>> = {
  model: fc.oneof({ weight: 6, arbitrary: anyString }, { weight: 1, arbitrary: json }),
  stream: fc.oneof(
    { weight: 2, arbitrary: fc.boolean() },
    fc.constant(null),
    laxBoolString,
    fc.constantFrom(0, 1, 2, 1.0, 0.5),
    json,
  ),
  max_tokens: fc.oneof({ weight: 4, arbitrary: tokenNumber }, fc.constant(null), json),
  max_completion_tokens: fc.oneof({ weight: 4, arbitrary: tokenNumber }, fc.constant(null), json),
  min_tokens: fc.oneof({ weight: 4, arbitrary: tokenNumber }, fc.constant(null), json),
  echo: fc.oneof(fc.boolean(), fc.constant(null), laxBoolString, json),
  prompt_logprobs: fc.oneof(fc.constantFrom(0, 1, -1, null, false), json),
  return_token_ids: fc.oneof(fc.boolean(), fc.constant(null), laxBoolString, json),
  return_prompt_text: fc.oneof(fc.boolean(), fc.constant(null), laxBoolString, json),
  truncate_prompt_tokens: fc.oneof(fc.constantFrom(0, 5, -1, null), json),
  n: fc.oneof(
    { weight: 4, arbitrary: fc.integer({ min: 0, max: 8 }) },
    fc.constant(null),
    laxIntString,
    json,
  ),
  priority: fc.oneof(
    { weight: 2, arbitrary: fc.constant(0) },
    fc.integer(),
    fc.constant(null),
    fc.constantFrom('0', ' 0', '+0', '0.0', false, true, '1'),
    json,
  ),
  chat_template: fc.oneof(anyString, fc.constant(null), json),
  chat_template_kwargs: fc.oneof(fc.constant(null), json),
  messages: fc.oneof(
    { weight: 4, arbitrary: fc.array(message, { maxLength: 5 }) },
    fc.constant(null),
    json,
  ),
  prompt: fc.oneof(anyString, fc.array(fc.nat(50_000)), fc.constant(null), json),
  tools: fc.oneof(
    { weight: 2, arbitrary: fc.array(toolDefinition, { maxLength: 2 }) },
    fc.constant(null),
    json,
  ),
  documents: fc.oneof(
    { weight: 2, arbitrary: fc.array(functionDefinition, { maxLength: 2 }) },
    fc.constant(null),
    json,
  ),
};
const FIELDS = Object.keys(fieldValues);

const member = fc.oneof(
  // A field Sluice reads, usually spelled plainly (the serializer may still escape it).
  fc.constantFrom(...FIELDS).chain((k) => fieldValues[k]!.map((v) => [k, v] as const)),
  // Junk: any key, any nested value.
  fc.tuple(
    fc.oneof(fc.string(), fc.constantFrom('Model', 'model ', 'max_tokens_', '__proto__')),
    json,
  ),
);

/** A request-like object: the fields above in random order, duplicates included, plus junk. */
export const requestMembers: fc.Arbitrary<Members> = fc
  .record({
    model: fc.option(fieldValues.model!, { freq: 8, nil: undefined }),
    members: fc.array(member, { maxLength: 8 }),
    at: fc.nat(),
  })
  .map(({ model, members, at }) => {
    const entries: (readonly [string, Value])[] = [...members];
    if (model !== undefined) entries.splice(at % (entries.length + 1), 0, ['model', model]);
    return new Members(entries);
  });

/** Text that is mostly JSON-shaped, to reach deep into the walk's error paths. */
export const tokenSoup: fc.Arbitrary<string> = fc
  .tuple(
    fc.boolean(),
    fc.array(
      fc.constantFrom(
        '{',
        '}',
        '[',
        ']',
        ',',
        ':',
        '"',
        '\\',
        '\\u',
        '\\u00e9',
        '\\n',
        '\\x',
        'u',
        'a',
        '0',
        '1',
        '01',
        '-',
        '.',
        'e',
        'E',
        '+',
        '1e5',
        '-0.5',
        'true',
        'false',
        'null',
        'tru',
        'nul',
        ' ',
        '\n',
        '\t',
        '\r',
        '\u0001',
        '\u001f',
        '\u007f',
        '\uFEFF',
        'é',
        '"model"',
        '"model":"m"',
        '"stream"',
        '"max_tokens"',
        '"messages"',
        '"prompt"',
        '"max_completion_tokens"',
        '"min_tokens"',
        '"echo"',
        '"prompt_logprobs"',
        '"return_token_ids"',
        '"truncate_prompt_tokens"',
        '"5"',
        '"true"',
        '"tools"',
        '"documents"',
        '"mod\\u0065l"',
        '"m"',
        '[]',
        '{}',
        '""',
      ),
      { maxLength: 30 },
    ),
  )
  .map(([brace, parts]) => (brace ? '{' : '') + parts.join(''));
