import { describe, expect, it } from 'vitest';
import { engineRequests, peekRequest, RequestPeekError } from '../src/index.js';
import { bytes, peekError } from './helpers.js';

const peek = (text: string) => peekRequest(bytes(text));
const at = (text: string, needle: string, from = 0) => {
  const k = bytes(text).indexOf(needle, from);
  if (k < 0) throw new Error(`${needle} not in ${text}`);
  return k;
};

describe('peekRequest: a chat request', () => {
  const body =
    '{"model":"gpt-4o","messages":[{"role":"user","content":"hi \\"there\\""}],' +
    '"stream":true,"max_tokens":128,"max_completion_tokens":null,"temperature":0.2}';

  it('reads the fields and where their values sit', () => {
    const start = at(body, '[');
    expect(peek(body)).toStrictEqual({
      model: 'gpt-4o',
      stream: true,
      maxTokens: 128,
      maxCompletionTokens: undefined,
      minTokens: undefined,
      echo: undefined,
      promptLogprobs: false,
      returnTokenIds: undefined,
      returnPromptText: undefined,
      truncatePromptTokens: false,
      n: undefined,
      prompts: 1,
      messages: { start, end: at(body, '],') + 1 },
      prompt: undefined,
      tools: undefined,
      documents: undefined,
      chatTemplate: undefined,
      chatTemplateKwargs: undefined,
      modelSpan: { start: 9, end: 17 },
      streamSpan: { start: at(body, 'true'), end: at(body, 'true') + 4 },
      maxTokensSpan: { start: at(body, '128'), end: at(body, '128') + 3 },
      maxCompletionTokensSpan: { start: at(body, 'null'), end: at(body, 'null') + 4 },
      objectStart: 0,
      objectEnd: body.length - 1,
    });
  });

  it('gives spans a rewrite can splice', () => {
    const buf = bytes(body);
    const r = peekRequest(buf);
    // Splice in body order: the messages array comes before max_tokens here.
    expect(r.messages!.start).toBeLessThan(r.maxTokensSpan!.start);
    const rewritten = Buffer.concat([
      buf.subarray(0, r.messages!.start + 1),
      bytes('{"role":"system","content":"be brief"},'),
      buf.subarray(r.messages!.start + 1, r.maxTokensSpan!.start),
      bytes('64'),
      buf.subarray(r.maxTokensSpan!.end),
    ]);
    const parsed = JSON.parse(rewritten.toString());
    expect(parsed.max_tokens).toBe(64);
    expect(parsed.messages[0]).toStrictEqual({ role: 'system', content: 'be brief' });
    expect(parsed.messages).toHaveLength(2);
  });

  it('reads where tools and RAG documents sit, of any type, null as absent', () => {
    const tools = '[{"type":"function","function":{"name":"f","description":"d"}}]';
    const body = `{"model":"m","messages":[],"tools":${tools},"documents":[{"name":"g"}]}`;
    const r = peek(body);
    expect(r.tools).toStrictEqual({ start: at(body, tools), end: at(body, tools) + tools.length });
    expect(r.documents).toStrictEqual({
      start: at(body, '[{"name"'),
      end: body.length - 1,
    });
    // Not checked (it gates nothing; the engine refuses a bad one): any value is a span.
    expect(peek('{"model":"m","tools":"abc"}').tools).toStrictEqual({ start: 21, end: 26 });
    expect(peek('{"model":"m","documents":7}').documents).toStrictEqual({ start: 25, end: 26 });
    expect(peek('{"model":"m","tools":null,"documents":null}')).toMatchObject({
      tools: undefined,
      documents: undefined,
    });
    // Escaped keys are the same keys; the last of duplicates wins; nested ones are not top-level.
    expect(peek('{"model":"m","t\\u006fols":[1]}').tools).toStrictEqual({ start: 26, end: 29 });
    expect(peek('{"model":"m","tools":[1],"tools":[22]}').tools).toStrictEqual({
      start: 33,
      end: 37,
    });
    expect(peek('{"model":"m","x":{"tools":[1],"documents":[2]}}')).toMatchObject({
      tools: undefined,
      documents: undefined,
    });
    // Keys of the same lengths that are neither.
    expect(peek('{"model":"m","toolz":[1],"functionz":[2],"Tools":[3]}')).toMatchObject({
      tools: undefined,
      documents: undefined,
    });
  });

  it('reads a completions request: prompt of any type', () => {
    expect(peek('{"model":"m","prompt":"say hi"}').prompt).toStrictEqual({ start: 22, end: 30 });
    expect(peek('{"model":"m","prompt":[1,2,3]}').prompt).toStrictEqual({ start: 22, end: 29 });
    expect(peek('{"model":"m","prompt":null}').prompt).toBeUndefined();
    expect(peek('{"model":"m"}').prompt).toBeUndefined();
  });

  it('skips nested fields of the same names', () => {
    const r = peek(
      '{"x":{"model":1,"stream":"no","max_tokens":-1},"model":"m","y":[{"messages":2}]}',
    );
    expect(r.model).toBe('m');
    expect(r.stream).toBeUndefined();
    expect(r.maxTokens).toBeUndefined();
    expect(r.messages).toBeUndefined();
  });

  it('accepts whitespace around and inside the body', () => {
    const text = ' \r\n\t{ "model" :\n"m" ,\t"stream"\r:\tfalse }\n \t';
    const r = peek(text);
    expect(r.model).toBe('m');
    expect(r.stream).toBe(false);
    expect(r.objectStart).toBe(4);
    expect(r.objectEnd).toBe(text.indexOf('}'));
    expect(r.streamSpan).toStrictEqual({
      start: text.indexOf('false'),
      end: text.indexOf('false') + 5,
    });
  });

  it('takes a Uint8Array that is not a Buffer', () => {
    const u8 = new Uint8Array(bytes(body));
    expect(peekRequest(u8).model).toBe('gpt-4o');
  });
});

describe('peekRequest: keys', () => {
  it('compares keys after unescaping them', () => {
    expect(peek('{"mod\\u0065l":"m"}').model).toBe('m');
    expect(peek('{"\\u006d\\u006F\\u0064\\u0065\\u006c":"m"}').model).toBe('m');
    expect(peek('{"model":"m","max\\u005ftokens":7}').maxTokens).toBe(7);
    expect(peek('{"model":"m","str\\u0065am":true}').stream).toBe(true);
    const text = '{"model":"m","m\\u0065ssages":[]}';
    expect(peek(text).messages).toStrictEqual({ start: 29, end: 31 });
    expect(text.slice(29, 31)).toBe('[]');
  });

  it('does not take near misses for known keys', () => {
    for (const key of ['Model', 'model ', 'mode', 'models', 'model\\u0000', '\\u006dode']) {
      const r = peek(`{"${key}":"m"}`);
      expect(r.model).toBeUndefined();
      expect(r.modelSpan).toBeUndefined();
    }
  });

  it('takes the last of duplicate keys, as JSON.parse does', () => {
    expect(peek('{"model":"a","model":"b"}').model).toBe('b');
    expect(peek('{"model":1,"model":"b"}').model).toBe('b');
    expect(peek('{"model":"a","mod\\u0065l":"b"}').model).toBe('b');
    expect(peek('{"model":"a","model":null}').model).toBeUndefined();
    expect(peekError('{"model":"a","model":1}').message).toBe('model must be a string or null');
    const text = '{"model":"m","max_tokens":"x","max_tokens":5,"stream":true,"stream":null}';
    const r = peek(text);
    expect(r.maxTokens).toBe(5);
    expect(r.maxTokensSpan).toStrictEqual({ start: text.indexOf('5'), end: text.indexOf('5') + 1 });
    expect(r.stream).toBeUndefined();
    expect(r.streamSpan).toStrictEqual({ start: text.lastIndexOf('null'), end: text.length - 1 });
  });
});

describe('peekRequest: model', () => {
  it('decodes unicode, raw or escaped, as JSON.parse does', () => {
    for (const text of [
      '{"model":"café-模型-😀"}',
      '{"model":"caf\\u00e9-\\u6a21\\u578b-\\ud83d\\ude00"}',
      '{"model":"lone \\ud800 surrogate"}',
      '{"model":"\\"q\\" \\\\ \\/ \\b\\f\\n\\r\\t"}',
      '{"model":"\uFEFFbom inside"}',
      '{"model":""}',
    ]) {
      expect(peek(text).model).toBe(JSON.parse(text).model);
    }
  });

  it('refuses invalid UTF-8 in model instead of decoding it to U+FFFD', () => {
    for (const raw of [
      [0xc3, 0x28],
      [0xe4, 0xb8],
      [0xff],
      [0xed, 0xa0, 0x80],
      [0xf0, 0x9f, 0x98],
    ]) {
      const body = Buffer.concat([bytes('{"model":"a'), Buffer.from(raw), bytes('\\n"}')]);
      expect(peekError(body).message).toMatch(/^invalid JSON at byte 11: invalid UTF-8/);
    }
  });

  it('is optional, as in vLLM: absent or null is undefined, "" is ""', () => {
    // vLLM's request models declare `model: str | None = None` and serve a request without one
    // with the engine's first model: where it goes is the gateway's decision.
    for (const text of [
      '{"messages":[]}',
      '{}',
      '{"model":null,"messages":[]}',
      '{ "model" : null }',
    ]) {
      const r = peek(text);
      expect(r.model, text).toBeUndefined();
    }
    expect(peek('{"messages":[]}').modelSpan).toBeUndefined();
    // The span of a null, as for the other fields whose key is present.
    const text = '{"model":null,"stream":true}';
    expect(peek(text).modelSpan).toStrictEqual({ start: 9, end: 13 });
    expect(peek(text).stream).toBe(true);
    expect(peek('{"model":""}').model).toBe('');
  });

  it('must be a string or null', () => {
    for (const value of ['1', 'true', '["m"]', '{"id":"m"}']) {
      const error = peekError(`{"model":${value}}`);
      expect(error.code).toBe('ERR_FIELD');
      expect(error.field).toBe('model');
      expect(error.message).toBe('model must be a string or null');
      expect(error.offset).toBe(9);
    }
  });
});

describe('peekRequest: stream and messages', () => {
  it('reads stream as a boolean; null is absent', () => {
    expect(peek('{"model":"m","stream":true}').stream).toBe(true);
    expect(peek('{"model":"m","stream":false}').stream).toBe(false);
    expect(peek('{"model":"m","stream":null}').stream).toBeUndefined();
    expect(peek('{"model":"m"}').stream).toBeUndefined();
    expect(peek('{"model":"m"}').streamSpan).toBeUndefined();
  });

  // vLLM's pydantic reads these as booleans (lax mode): a client sending one gets a stream,
  // or not, from vLLM, and must get the same from Sluice.
  it.each([
    ['"true"', true],
    ['"True"', true],
    ['"yes"', true],
    ['"on"', true],
    ['"1"', true],
    ['1', true],
    ['1.0', true],
    ['"false"', false],
    ['"OFF"', false],
    ['"n"', false],
    ['0', false],
    ['-0', false],
    ['"\u0074rue"', true],
  ])('reads stream %s as %s', (value, stream) => {
    expect(peek(`{"model":"m","stream":${value}}`).stream).toBe(stream);
  });

  it.each(['"maybe"', '" true"', '"true "', '""', '2', '0.5', '-1', '[]', '{}'])(
    'refuses stream: %s',
    (value) => {
      const error = peekError(`{"model":"m","stream":${value}}`);
      expect(error.code).toBe('ERR_FIELD');
      expect(error.field).toBe('stream');
      expect(error.message).toBe('stream must be a boolean or null');
      expect(error.offset).toBe(22);
    },
  );

  it('refuses messages that are not an array; null is absent', () => {
    expect(peek('{"model":"m","messages":null}').messages).toBeUndefined();
    for (const value of ['"hi"', '{}', '1']) {
      const error = peekError(`{"model":"m","messages":${value}}`);
      expect(error.field).toBe('messages');
      expect(error.message).toBe('messages must be an array');
    }
  });
});

describe('peekRequest: min_tokens and echo', () => {
  // min_tokens is read like the limits: the degradation rewrite may not scale below it.
  it.each([
    ['0', 0],
    ['500', 500],
    ['5e2', 500],
    ['500.0', 500],
    ['-0', 0],
    ['null', undefined],
  ])('reads min_tokens %s as %s', (text, value) => {
    expect(peek(`{"model":"m","min_tokens":${text}}`).minTokens).toBe(value);
    expect(peek(`{"model":"m","min\\u005ftokens":${text}}`).minTokens).toBe(value);
  });

  it.each([
    ['"5"', 5],
    ['" 500 "', 500],
    ['"5_00"', 500],
    ['true', 1],
    ['false', 0],
  ])("reads min_tokens %s as %s, as vLLM's pydantic does", (text, value) => {
    expect(peek(`{"model":"m","min_tokens":${text}}`).minTokens).toBe(value);
  });

  it.each(['-1', '1.5', '1e400', '"-5"', '"5e2"', '"five"', '[5]'])(
    'refuses min_tokens: %s',
    (text) => {
      const error = peekError(`{"model":"m","min_tokens":${text}}`);
      expect(error.code).toBe('ERR_FIELD');
      expect(error.field).toBe('min_tokens');
      expect(error.message).toBe('min_tokens must be a non-negative integer or null');
      expect(error.offset).toBe(26);
    },
  );

  it('checks min_tokens after the limits and before messages', () => {
    expect(peekError('{"model":"m","min_tokens":-1,"max_completion_tokens":-1}').field).toBe(
      'max_completion_tokens',
    );
    expect(peekError('{"model":"m","messages":1,"min_tokens":-1}').field).toBe('min_tokens');
  });

  it('reads echo as pydantic does: false for its false values, true for any other', () => {
    expect(peek('{"model":"m"}').echo).toBeUndefined();
    expect(peek('{"model":"m","echo":null}').echo).toBeUndefined();
    expect(peek('{"model":"m","echo":false}').echo).toBe(false);
    expect(peek('{"model":"m","echo":true}').echo).toBe(true);
    expect(peek('{"model":"m","ech\\u006f":true}').echo).toBe(true);
    // vLLM's pydantic reads 0, "false", "no", "off" … as false: no echo
    for (const value of ['0', '0.0', '"0"', '"false"', '"No"', '"off"', '"f"', '"n"']) {
      expect(peek(`{"model":"m","echo":${value}}`).echo).toBe(false);
    }
    // and 1, "yes", "true" … as true. Never refused: a value pydantic refuses (vLLM answers
    // 400) counts as on, so that the rewrite leaves the prompt alone.
    for (const value of ['1', '"yes"', '"TRUE"', '"on"', '2', '"maybe"', '[]', '{}']) {
      expect(peek(`{"model":"m","echo":${value}}`).echo).toBe(true);
    }
    expect(peek('{"model":"m","echo":true,"echo":false}').echo).toBe(false);
    // nested ones are not the request's
    expect(peek('{"model":"m","x":{"echo":true,"min_tokens":5}}')).toMatchObject({
      echo: undefined,
      minTokens: undefined,
    });
  });
});

describe('peekRequest: the fields with which vLLM returns or truncates the prompt', () => {
  it('reads prompt_logprobs and truncate_prompt_tokens as set for any value but null', () => {
    // prompt_logprobs 0 scores every prompt token (0 extra candidates); truncate_prompt_tokens
    // -1 truncates to the context window, 0 to nothing
    for (const value of ['0', '1', '-1', '5', 'false', '"0"', '[]']) {
      expect(peek(`{"model":"m","prompt_logprobs":${value}}`).promptLogprobs).toBe(true);
      expect(peek(`{"model":"m","truncate_prompt_tokens":${value}}`).truncatePromptTokens).toBe(
        true,
      );
    }
    for (const body of ['{"model":"m"}', '{"model":"m","prompt_logprobs":null}']) {
      expect(peek(body).promptLogprobs).toBe(false);
    }
    expect(peek('{"model":"m","truncate_prompt_tokens":null}').truncatePromptTokens).toBe(false);
    // escaped keys, the last of duplicates, nested ones not the request's
    expect(peek('{"model":"m","prompt_l\\u006fgprobs":0}').promptLogprobs).toBe(true);
    expect(peek('{"model":"m","prompt_logprobs":0,"prompt_logprobs":null}').promptLogprobs).toBe(
      false,
    );
    expect(peek('{"model":"m","x":{"truncate_prompt_tokens":5}}').truncatePromptTokens).toBe(false);
  });

  it("reads return_token_ids and return_prompt_text as echo: pydantic's false values are off", () => {
    for (const [value, on] of [
      ['true', true],
      ['1', true],
      ['"yes"', true],
      ['"maybe"', true], // refused by vLLM: counts as on
      ['false', false],
      ['0', false],
      ['"false"', false],
      ['"off"', false],
      ['null', undefined],
    ] as const) {
      const r = peek(`{"model":"m","return_token_ids":${value},"return_prompt_text":${value}}`);
      expect(r.returnTokenIds, value).toBe(on);
      expect(r.returnPromptText, value).toBe(on);
    }
    expect(peek('{"model":"m"}')).toMatchObject({
      returnTokenIds: undefined,
      returnPromptText: undefined,
    });
    // keys of the same lengths that are not these
    expect(
      peek('{"model":"m","return_token_idz":1,"Return_prompt_text":1,"prompt_logprobz":1}'),
    ).toMatchObject({
      returnTokenIds: undefined,
      returnPromptText: undefined,
      promptLogprobs: false,
    });
  });
});

describe('peekRequest: n and batches, the engine requests a request becomes', () => {
  it.each([
    ['{"model":"m","messages":[]}', undefined, 1],
    ['{"model":"m","messages":[],"n":null}', undefined, 1],
    ['{"model":"m","messages":[],"n":1}', 1, 1],
    ['{"model":"m","messages":[],"n":8}', 8, 8],
    ['{"model":"m","messages":[],"\\u006e":3}', 3, 3],
    ['{"model":"m","messages":[],"n":2,"x":{"n":50}}', 2, 2],
    ['{"model":"m","prompt":"one"}', undefined, 1],
    ['{"model":"m","prompt":[1,2,3]}', undefined, 1],
    ['{"model":"m","prompt":[]}', undefined, 1],
    ['{"model":"m","prompt":["a","b","c"]}', undefined, 3],
    ['{"model":"m","prompt":[[1,2],[3],[4,5,6]],"n":2}', 2, 6],
    ['{"model":"m","prompt": [ "a" , "b,c" ] ,"n":4}', 4, 8],
    ['{"model":"m","prompt":["a"],"n":9007199254740991}', 9007199254740991, 9007199254740991],
    ['{"model":"m","prompt":["a","b"],"n":9007199254740991}', 9007199254740991, 9007199254740991],
  ])('%s: n %s, %s engine requests', (text, n, sequences) => {
    expect(peek(text)).toMatchObject({ n });
    expect(engineRequests(peek(text), 'completion')).toBe(sequences);
  });

  it('counts no prompts on the chat endpoint: vLLM ignores a stray prompt there', () => {
    const body = peek('{"model":"m","messages":[],"prompt":["a","b","c","d"],"n":2}');
    expect(body.prompts).toBe(4);
    expect(engineRequests(body, 'chat')).toBe(2);
    expect(engineRequests(body, 'completion')).toBe(8);
  });

  it.each(['0', '-0', '0.0', 'null', '"0"', '" +0.0 "', 'false'])(
    'accepts a body priority of %s: Sluice keeps the order',
    (text) => {
      expect(peek(`{"model":"m","priority":${text}}`).model).toBe('m');
    },
  );

  it.each(['1', '-1000', '0.5', '"1"', '"x"', '"0.5"', 'true', '1e400', '[]'])(
    'refuses a body priority of %s',
    (text) => {
      const error = peekError(`{"model":"m","priority":${text}}`);
      expect(error.code).toBe('ERR_FIELD');
      expect(error.field).toBe('priority');
      expect(error.message).toMatch(/^priority is set by Sluice \(the x-sluice-priority header\)/);
    },
  );

  it('reads where chat_template and chat_template_kwargs sit, null as absent', () => {
    const body = '{"model":"m","chat_template":"{{ x }}","chat_template_kwargs":{"documents":[]}}';
    const r = peek(body);
    expect(r.chatTemplate).toStrictEqual({
      start: at(body, '"{{'),
      end: at(body, ',"chat_template_kwargs'),
    });
    expect(r.chatTemplateKwargs).toStrictEqual({ start: at(body, '{"doc'), end: body.length - 1 });
    expect(peek('{"model":"m","chat_template":null,"chat_template_kwargs":null}')).toMatchObject({
      chatTemplate: undefined,
      chatTemplateKwargs: undefined,
    });
  });

  it.each([
    ['"2"', 2],
    ['" 3 "', 3],
    ['"+4.0"', 4],
    ['true', 1],
  ])("reads n %s as %s, as vLLM's pydantic does", (text, n) => {
    expect(peek(`{"model":"m","prompt":["a","b"],"n":${text}}`)).toMatchObject({ n });
  });

  it.each(['0', '-1', '1.5', '"0"', '"2.5"', '"two"', 'false', '[2]'])('refuses n: %s', (text) => {
    const error = peekError(`{"model":"m","n":${text}}`);
    expect(error.code).toBe('ERR_FIELD');
    expect(error.field).toBe('n');
    expect(error.message).toBe('n must be a positive integer or null');
  });
});

describe('peekRequest: max_tokens and max_completion_tokens', () => {
  // JSON numbers mean their value: 1e2 and 100.0 are the integer 100 (JSON.parse agrees, and so
  // does vLLM's pydantic model), -0 is 0.
  it.each([
    ['0', 0],
    ['1', 1],
    ['512', 512],
    ['1e2', 100],
    ['1E+2', 100],
    ['100.0', 100],
    ['0.5e1', 5],
    ['-0', 0],
    ['9007199254740991', 9007199254740991],
    ['null', undefined],
  ])('accepts %s as %s', (text, value) => {
    const r = peek(`{"model":"m","max_tokens":${text},"max_completion_tokens":${text}}`);
    expect(r.maxTokens).toBe(value);
    expect(r.maxCompletionTokens).toBe(value);
    expect(r.maxTokensSpan).toStrictEqual({ start: 26, end: 26 + text.length });
  });

  // vLLM's request models run pydantic in lax mode: a string of an integer, true and false are
  // integers there, and the gate, the estimate and the rewrite must see the number vLLM sees.
  it.each([
    ['"100"', 100],
    ['" 100\\n"', 100],
    ['"+100"', 100],
    ['"00100"', 100],
    ['"100.0"', 100],
    ['"1_000"', 1000],
    ['"-0"', 0],
    ['"\\u0031\\u0030"', 10],
    ['true', 1],
    ['false', 0],
  ])("accepts %s as %s, as vLLM's pydantic does", (text, value) => {
    const r = peek(`{"model":"m","max_tokens":${text},"max_completion_tokens":${text}}`);
    expect(r.maxTokens).toBe(value);
    expect(r.maxCompletionTokens).toBe(value);
    // the span is the whole value, quotes included, so a rewrite can write a number over it
    expect(r.maxTokensSpan).toStrictEqual({ start: 26, end: 26 + text.length });
  });

  it.each([
    '-1',
    '1.5',
    '1e-1',
    '9007199254740992',
    '1e400',
    '-1e400',
    '"-5"',
    '"1.5"',
    '"1e2"',
    '"0x10"',
    '"1__000"',
    '"five"',
    '""',
    '"9007199254740992"',
    '[5]',
    '{}',
  ])('refuses %s, naming the field', (text) => {
    const error = peekError(`{"model":"m","max_tokens":${text}}`);
    expect(error.code).toBe('ERR_FIELD');
    expect(error.field).toBe('max_tokens');
    expect(error.message).toBe('max_tokens must be a non-negative integer or null');
    expect(error.offset).toBe(26);
    const other = peekError(`{"model":"m","max_completion_tokens":${text}}`);
    expect(other.field).toBe('max_completion_tokens');
    expect(other.message).toBe('max_completion_tokens must be a non-negative integer or null');
  });
});

describe('peekRequest: body shape', () => {
  it.each(['[]', '"model"', '1', 'null', 'true', ' [{"model":"m"}] '])(
    'refuses a top-level %s that is not an object',
    (text) => {
      const error = peekError(text);
      expect(error.code).toBe('ERR_JSON');
      expect(error.message).toBe('request body must be a JSON object');
      expect(error.offset).toBe(text.length - text.trimStart().length);
    },
  );

  it('reports bad JSON before the wrong shape', () => {
    expect(peekError('[1,]').message).toBe(
      "invalid JSON at byte 3: unexpected ']', expected a value",
    );
    expect(peekError('[1] x').message).toBe(
      "invalid JSON at byte 4: unexpected 'x', expected the end of the body",
    );
  });

  it('refuses a body that starts with a UTF-8 byte order mark', () => {
    const error = peekError('\uFEFF{"model":"m"}');
    expect(error.code).toBe('ERR_JSON');
    expect(error.offset).toBe(0);
    expect(error.message).toBe('invalid JSON at byte 0: a byte order mark (BOM) is not allowed');
  });

  it('refuses an empty or blank body', () => {
    expect(peekError('').message).toBe(
      'invalid JSON at byte 0: unexpected end of input, expected a JSON object',
    );
    expect(peekError(' \n').offset).toBe(2);
  });
});

describe('peekRequest: syntax errors point at the byte', () => {
  it.each([
    ['{"model" "m"}', 9, `unexpected '"', expected ':' after an object key`],
    ['{"model":"m",}', 13, `unexpected '}', expected '"' to start an object key`],
    ['{"model":"m" "x":1}', 13, `unexpected '"', expected ',' or '}' after an object member`],
    ['{model:"m"}', 1, `unexpected 'm', expected '"' to start an object key`],
    [
      '{"model":"m"}}',
      13,
      `unexpected '}', expected the end of the body after the top-level object`,
    ],
    [
      '{"model":"m"} x',
      14,
      `unexpected 'x', expected the end of the body after the top-level object`,
    ],
    ['{"model":"a\u0001"}', 11, 'control character byte 0x01 in a string must be escaped'],
    ['{"model":"a\nb"}', 11, 'control character byte 0x0A in a string must be escaped'],
    ['{"model":"\\x"}', 10, `invalid escape in a string: '\\' followed by 'x'`],
    ['{"model":"\\u12G4"}', 10, 'a \\u escape needs 4 hex digits'],
    ['{"model":"m","n":01}', 17, 'a number must not have leading zeros'],
    ['{"model":"m","n":-01}', 18, 'a number must not have leading zeros'],
    ['{"model":"m","n":-}', 18, `unexpected '}', expected a digit after '-'`],
    ['{"model":"m","n":1.}', 19, `unexpected '}', expected a digit after '.'`],
    ['{"model":"m","n":1e}', 19, `unexpected '}', expected a digit in the exponent`],
    ['{"model":"m","n":1e+}', 20, `unexpected '}', expected a digit in the exponent`],
    ['{"model":"m","n":.5}', 17, `unexpected '.', expected a value`],
    ['{"model":"m","n":+1}', 17, `unexpected '+', expected a value`],
    ['{"model":"m","n":[1,2,]}', 22, `unexpected ']', expected a value`],
    ['{"model":"m","n":[1 2]}', 20, `unexpected '2', expected ',' or ']' after an array element`],
    ['{"model":"m","n":{"a":1,}}', 24, `unexpected '}', expected '"' to start an object key`],
    ['{"model":"m","n":{"a" 1}}', 22, `unexpected '1', expected ':' after an object key`],
    ['{"model":"m","n":tru}', 20, `unexpected '}', expected 'true'`],
    ['{"model":"m","n":nul', 20, `unexpected end of input, expected 'null'`],
    ['{"model":"m","n":True}', 17, `unexpected 'T', expected a value`],
    ['{"model":"m","n":NaN}', 17, `unexpected 'N', expected a value`],
    ['{"model":"m","n":\'x\'}', 17, `unexpected ''', expected a value`],
    ['{"model":"m","n":\u00a0}', 17, 'unexpected byte 0xC2, expected a value'],
    ['{"model":"abc', 13, 'unexpected end of input, in the string that starts at byte 9'],
    ['{"model":"abc\\', 14, 'unexpected end of input, in a string escape'],
    ['{"model":"\\u12', 14, 'unexpected end of input, in a \\u escape'],
    ['{"model":"m"', 12, "unexpected end of input, expected ',' or '}' after an object member"],
    [
      '{"model":"m","n":[1',
      19,
      "unexpected end of input, expected ',' or ']' after an array element",
    ],
    ['{"model":', 9, 'unexpected end of input, expected a value'],
    ['{', 1, `unexpected end of input, expected '"' to start an object key`],
  ])('%j → byte %i', (text, offset, detail) => {
    const error = peekError(text);
    expect(error).toBeInstanceOf(RequestPeekError);
    expect(error.code).toBe('ERR_JSON');
    expect(error.offset).toBe(offset);
    expect(error.message).toBe(`invalid JSON at byte ${offset}: ${detail}`);
    expect(() => JSON.parse(text)).toThrow(SyntaxError);
  });

  it('counts bytes, not characters, in offsets', () => {
    const error = peekError('{"model":"é模😀","x":tru}');
    expect(error.offset).toBe(Buffer.byteLength('{"model":"é模😀","x":tru'));
  });

  it('checks the whole body even after every known field is read', () => {
    const error = peekError(`{"model":"m","stream":true,"tail":"${'x'.repeat(5000)}\u0002"}`);
    expect(error.offset).toBe(35 + 5000);
  });
});
