import { Buffer } from 'node:buffer';
import { describe, expect, it } from 'vitest';
import {
  peekRequest,
  plannedMaxTokens,
  rewriteRequest,
  VLLM_COMPLETION_MAX_TOKENS,
} from '../src/index.js';
import type { PeekedRequest, RewritePlan } from '../src/index.js';
import { basePlan } from './rewrite-helpers.js';

const rewrite = (text: string, plan: Partial<RewritePlan>): string => {
  const body = Buffer.from(text);
  return rewriteRequest(body, peekRequest(body), { ...basePlan, ...plan }).toString();
};
const tired: Partial<RewritePlan> = { instruction: 'Answer concisely.', maxTokensFactor: 0.7 };

describe('rewriteRequest: members of the top-level object', () => {
  it('adds max_tokens to an object with no members (a peek the caller built)', () => {
    const body = Buffer.from(' {  \n } ');
    // A real peek's fields, with the spans of this body.
    const peeked: PeekedRequest = {
      ...peekRequest(Buffer.from('{"model":"m"}')),
      modelSpan: { start: 2, end: 2 },
      objectStart: 1,
      objectEnd: 6,
    };
    const out = rewriteRequest(body, peeked, {
      ...basePlan,
      endpoint: 'completion',
      maxTokensFactor: 0.5,
      minMaxTokens: 1,
    });
    expect(out.toString()).toBe(' {"max_tokens":8  \n } ');
  });

  it('adds max_tokens after the only member, keeping the whitespace before }', () => {
    const plan = { endpoint: 'completion' as const, maxTokensFactor: 0.5, minMaxTokens: 1 };
    expect(rewrite('{"model":"m"}', plan)).toBe('{"model":"m","max_tokens":8}');
    expect(rewrite('\n{\n  "model": "m"\n}\n', plan)).toBe(
      '\n{\n  "model": "m","max_tokens":8\n}\n',
    );
  });

  it('chat with no message to carry the instruction and no limit: nothing changes', () => {
    for (const text of ['{"model":"m","messages":[]}', '{"messages":[ ],"model":"m"}']) {
      const body = Buffer.from(text);
      expect(rewriteRequest(body, peekRequest(body), { ...basePlan, ...tired })).toBe(body);
    }
  });

  it('returns the very same buffer when there is nothing to do', () => {
    const body = Buffer.from('{"model":"m","messages":[],"max_tokens":5}');
    const peeked = peekRequest(body);
    expect(rewriteRequest(body, peeked, basePlan)).toBe(body);
    expect(rewriteRequest(body, peeked, { ...basePlan, instruction: '' })).toBe(body);
    // never raised: 5 is below the floor, so it stays
    expect(rewriteRequest(body, peeked, { ...basePlan, maxTokensFactor: 0.3 })).toBe(body);
    // completions are not touched by a chat plan's messages, nor chat by a completion plan's
    expect(
      rewriteRequest(body, peeked, { ...basePlan, endpoint: 'completion', instruction: 'x' }),
    ).toBe(body);
  });

  it('takes a Uint8Array that is a slice of a larger buffer', () => {
    const backing = Buffer.from('xx{"model":"m","max_tokens":100}yy');
    const body = new Uint8Array(backing.buffer, backing.byteOffset + 2, backing.length - 4);
    const out = rewriteRequest(body, peekRequest(body), { ...basePlan, maxTokensFactor: 0.5 });
    expect(Buffer.isBuffer(out)).toBe(true);
    expect(out.toString()).toBe('{"model":"m","max_tokens":50}');
  });
});

describe('rewriteRequest: the system instruction (chat)', () => {
  const chat = (first: string) =>
    `{"model":"m","messages":[${first},{"role":"user","content":"hi"}]}`;

  it("'prepend' joins a leading system message in front of its text: never a second one", () => {
    // Chat templates that take messages[0] as the system prompt refuse another system
    // message (vLLM's examples/tool_chat_template_mistral3.jinja raises on it).
    expect(rewrite(chat('{"role":"system","content":"S"}'), { instruction: 'I' })).toBe(
      chat('{"role":"system","content":"I\\n\\nS"}'),
    );
    const parts =
      '{"role":"system","content":[{"type":"text","text":"S"},{"type":"text","text":"T"}]}';
    expect(rewrite(chat(parts), { instruction: 'I' })).toBe(
      chat(parts.replace('"S"', '"I\\n\\nS"')),
    );
  });

  it("'append' adds to a leading system message's string content", () => {
    const plan = { instruction: 'I', systemPrompt: 'append' as const };
    expect(rewrite(chat('{"role":"system","content":"S"}'), plan)).toBe(
      chat('{"role":"system","content":"S\\n\\nI"}'),
    );
    expect(rewrite(chat('{ "content" : "S" , "name":"x", "role" : "system" }'), plan)).toBe(
      chat('{ "content" : "S\\n\\nI" , "name":"x", "role" : "system" }'),
    );
    expect(rewrite(chat('{"role":"system","content":""}'), plan)).toBe(
      chat('{"role":"system","content":"\\n\\nI"}'),
    );
  });

  // Gemma-1/2 chat templates raise "System role not supported" on any system message, which
  // vLLM answers 400 (a jinja2 TemplateError): a request without a system message must not get
  // one. The instruction goes in front of the first user message's text instead.
  it('without a system message first, prefixes the first user message: never a new message', () => {
    for (const systemPrompt of ['prepend', 'append'] as const) {
      const plan = { instruction: 'I', systemPrompt };
      expect(rewrite(chat('{"role":"user","content":"U"}'), plan)).toBe(
        chat('{"role":"user","content":"I\\n\\nU"}'),
      );
      // the first message is not a user message: the first user message after it
      expect(rewrite(chat('{"role":"developer","content":"S"}'), plan)).toBe(
        `{"model":"m","messages":[{"role":"developer","content":"S"},{"role":"user","content":"I\\n\\nhi"}]}`,
      );
      expect(rewrite(chat('{"content":"S"}'), plan)).toBe(
        `{"model":"m","messages":[{"content":"S"},{"role":"user","content":"I\\n\\nhi"}]}`,
      );
      expect(rewrite(chat('"junk"'), plan)).toBe(
        `{"model":"m","messages":["junk",{"role":"user","content":"I\\n\\nhi"}]}`,
      );
      // only the first user message, and a system message after it is not a leading one
      const later =
        '{"model":"m","messages":[{"role":"assistant","content":"A"},{"role":"user","content":"U"},' +
        '{"role":"system","content":"S"},{"role":"user","content":"V"}]}';
      expect(rewrite(later, plan)).toBe(later.replace('"U"', '"I\\n\\nU"'));
    }
  });

  it("prefixes a user message's parts: its leading text part, or a new text part first", () => {
    const plan = { instruction: 'I', systemPrompt: 'append' as const };
    const user = (content: string) =>
      `{"model":"m","messages":[{"role":"user","content":${content}}]}`;
    const text = '[{"type":"text","text":"U"},{"type":"image_url","image_url":{"url":"u"}}]';
    expect(rewrite(user(text), plan)).toBe(user(text.replace('"U"', '"I\\n\\nU"')));
    const image = '[{"type":"image_url","image_url":{"url":"u"}},{"type":"text","text":"U"}]';
    expect(rewrite(user(image), plan)).toBe(user(`[{"type":"text","text":"I"},${image.slice(1)}`));
    expect(rewrite(user('[ ]'), plan)).toBe(user('[{"type":"text","text":"I"} ]'));
    expect(rewrite(user('null'), plan)).toBe(user('"I"'));
  });

  it('leaves messages alone when no message can take the instruction', () => {
    for (const messages of [
      '[]',
      '[{"role":"assistant","content":"A"}]',
      '[{"role":"user"}]', // no content
      '[{"role":"user","content":5}]',
      '[{"role":"user","content":{"text":"U"}}]',
      '[{"role":"system"},{"role":"user","content":"U"}]', // a system message first, no content
      '[{"role":"System","content":"S"},{"role":"tool","content":"T"}]',
    ]) {
      const body = Buffer.from(`{"model":"m","messages":${messages}}`);
      for (const systemPrompt of ['prepend', 'append'] as const)
        expect(
          rewriteRequest(body, peekRequest(body), { ...basePlan, instruction: 'I', systemPrompt }),
        ).toBe(body);
    }
  });

  it("joins the first part of a system message's content when it is a text part", () => {
    const plan = { instruction: 'I', systemPrompt: 'append' as const };
    const parts =
      '{"role":"system","content":[{"type":"text","text":"S"},{"type":"text","text":"T"}]}';
    expect(rewrite(chat(parts), plan)).toBe(chat(parts.replace('"S"', '"S\\n\\nI"')));
    // key order, escapes and a part without a type (the text is what vLLM reads)
    const loose = '{"content":[ { "text" : "S", "t\\u0079pe":"te\\u0078t" } ],"role":"system"}';
    expect(rewrite(chat(loose), plan)).toBe(chat(loose.replace('"S"', '"S\\n\\nI"')));
    const untyped = '{"role":"system","content":[{"text":"S"}]}';
    expect(rewrite(chat(untyped), plan)).toBe(chat(untyped.replace('"S"', '"S\\n\\nI"')));
  });

  it('gives a leading system message without text to join a text part first, or its content', () => {
    for (const systemPrompt of ['prepend', 'append'] as const) {
      const plan = { instruction: 'I', systemPrompt };
      const part = '{"type":"text","text":"I"}';
      for (const [first, expected] of [
        ['{"role":"system","content":null}', '{"role":"system","content":"I"}'],
        ['{"role":"system","content":[]}', `{"role":"system","content":[${part}]}`],
        [
          '{"role":"system","content":[{"type":"image_url","image_url":{"url":"u"},"text":"S"}]}',
          `{"role":"system","content":[${part},{"type":"image_url","image_url":{"url":"u"},"text":"S"}]}`,
        ],
        [
          '{"role":"system","content":[{"type":"text","text":null}]}',
          `{"role":"system","content":[${part},{"type":"text","text":null}]}`,
        ],
        ['{"role":"system","content":["S"]}', `{"role":"system","content":[${part},"S"]}`],
      ] as const)
        expect(rewrite(chat(first), plan)).toBe(chat(expected));
    }
  });

  it("'append' skips nested values in the first message, brackets in strings included", () => {
    const plan = { instruction: 'I', systemPrompt: 'append' as const };
    const first =
      '{"meta":{"a":[1,{"b":"}]\\""}],"c":-1.5e3},"role":"system","n":true,"content":"S"}';
    expect(rewrite(chat(first), plan)).toBe(chat(first.replace('"S"', '"S\\n\\nI"')));
  });

  it("'append' reads escaped keys and values, and lets the last duplicate count", () => {
    const plan = { instruction: 'I', systemPrompt: 'append' as const };
    expect(rewrite(chat('{"r\\u006fle":"sys\\u0074em","c\\u006Fntent":"S"}'), plan)).toBe(
      chat('{"r\\u006fle":"sys\\u0074em","c\\u006Fntent":"S\\n\\nI"}'),
    );
    // the last content is a string: append to it, not to the first
    expect(rewrite(chat('{"role":"system","content":"A","content":"B"}'), plan)).toBe(
      chat('{"role":"system","content":"A","content":"B\\n\\nI"}'),
    );
    // the last content is an empty array: a text part goes in it, not after "A"
    expect(rewrite(chat('{"role":"system","content":"A","content":[]}'), plan)).toBe(
      chat('{"role":"system","content":"A","content":[{"type":"text","text":"I"}]}'),
    );
    // the last role is user: the first user message, prefixed in either mode
    expect(rewrite(chat('{"role":"system","content":"A","r\\u006fle":"\\u0075ser"}'), plan)).toBe(
      chat('{"role":"system","content":"I\\n\\nA","r\\u006fle":"\\u0075ser"}'),
    );
  });

  it('escapes the instruction as JSON: quotes, backslashes, controls, unicode', () => {
    const instruction = 'Say "no" \\ twice.\nThen\ttab \u0001 é 中 😀 \u2028 \ud800';
    for (const systemPrompt of ['prepend', 'append'] as const) {
      const out = rewrite(chat('{"role":"system","content":"S"}'), { instruction, systemPrompt });
      const parsed = JSON.parse(out) as { messages: { content: string }[] };
      expect(parsed.messages[0]!.content).toBe(
        systemPrompt === 'prepend' ? `${instruction}\n\nS` : `S\n\n${instruction}`,
      );
    }
    expect(rewrite(chat('{}'), { instruction: '"\n' })).toContain('"content":"\\"\\n\\n\\nhi"}');
    expect(rewrite(chat('{"role":"system","content":null}'), { instruction: '"\n' })).toContain(
      '"content":"\\"\\n"}',
    );
  });

  it('leaves a chat body without messages alone (no array to add to)', () => {
    expect(rewrite('{"model":"m","messages":null}', { instruction: 'I' })).toBe(
      '{"model":"m","messages":null}',
    );
    expect(rewrite('{"model":"m","prompt":"p"}', { instruction: 'I' })).toBe(
      '{"model":"m","prompt":"p"}',
    );
  });
});

describe('rewriteRequest: the prompt prefix (completions)', () => {
  const plan: Partial<RewritePlan> = {
    endpoint: 'completion',
    instruction: 'Be brief.',
    completionPrefix: true,
  };

  it('prefixes a string prompt', () => {
    expect(rewrite('{"model":"m","prompt":"Once upon"}', plan)).toBe(
      '{"model":"m","prompt":"Be brief.\\n\\nOnce upon"}',
    );
    expect(rewrite('{"model":"m","prompt":""}', plan)).toBe(
      '{"model":"m","prompt":"Be brief.\\n\\n"}',
    );
  });

  it('prefixes a one-string array prompt', () => {
    expect(rewrite('{"model":"m","prompt":[ "Once \\"upon\\"" ] }', plan)).toBe(
      '{"model":"m","prompt":[ "Be brief.\\n\\nOnce \\"upon\\"" ] }',
    );
  });

  it('leaves token ids, batches of prompts and messages untouched', () => {
    for (const prompt of ['[1,2,3]', '[[1,2],[3]]', '["a","b"]', '[]', '[["a"]]']) {
      const body = `{"model":"m","prompt":${prompt},"messages":[]}`;
      expect(rewrite(body, plan)).toBe(body);
    }
  });

  it('completionPrefix false leaves the prompt untouched', () => {
    const body = '{"model":"m","prompt":"p"}';
    expect(rewrite(body, { ...plan, completionPrefix: false })).toBe(body);
  });
});

describe('rewriteRequest: token limits', () => {
  it('factor 1 leaves them alone and adds none', () => {
    expect(rewrite('{"model":"m","max_tokens":100}', { maxTokensFactor: 1 })).toBe(
      '{"model":"m","max_tokens":100}',
    );
    expect(
      rewrite('{"model":"m","messages":[{"role":"user","content":"U"}]}', { instruction: 'I' }),
    ).toBe('{"model":"m","messages":[{"role":"user","content":"I\\n\\nU"}]}');
  });

  it('scales and rounds, in place, whatever the number form', () => {
    expect(rewrite('{"model":"m","max_tokens":100}', { maxTokensFactor: 0.7 })).toBe(
      '{"model":"m","max_tokens":70}',
    );
    expect(rewrite('{"model":"m","max_tokens":1E+3 }', { maxTokensFactor: 0.3333 })).toBe(
      '{"model":"m","max_tokens":333 }',
    );
    expect(rewrite('{"model":"m","max_tokens":45}', { maxTokensFactor: 0.5 })).toBe(
      '{"model":"m","max_tokens":23}',
    );
  });

  it('floors at minMaxTokens', () => {
    expect(rewrite('{"model":"m","max_tokens":100}', { maxTokensFactor: 0.1 })).toBe(
      '{"model":"m","max_tokens":16}',
    );
    expect(rewrite('{"model":"m","max_tokens":100}', { maxTokensFactor: 0, minMaxTokens: 1 })).toBe(
      '{"model":"m","max_tokens":1}',
    );
  });

  it('never raises a limit, by the floor or by a factor above 1', () => {
    expect(rewrite('{"model":"m","max_tokens":10}', { maxTokensFactor: 0.3 })).toBe(
      '{"model":"m","max_tokens":10}',
    );
    expect(rewrite('{"model":"m","max_tokens":1e1}', { maxTokensFactor: 0.3 })).toBe(
      '{"model":"m","max_tokens":1e1}',
    );
    expect(rewrite('{"model":"m","max_tokens":100}', { maxTokensFactor: 1.5 })).toBe(
      '{"model":"m","max_tokens":100}',
    );
  });

  // vLLM gives a request without a limit the rest of the context window (get_max_tokens,
  // vllm/entrypoints/utils.py) but refuses prompt + max_tokens > max_model_len with a 400
  // (_validate_input, vllm/entrypoints/openai/serving_engine.py). Any limit added without
  // knowing max_model_len could turn a long prompt that fits into a refusal, only under load.
  it('chat: never sets a limit the client left to the context window', () => {
    for (const text of [
      '{"model":"m","messages":[{"role":"user","content":"U"}]}',
      '{"max_tokens":null,"model":"m"}',
      '{"model":"m","max_completion_tokens":null}',
      '{"model":"m","max_tokens":null,"max_completion_tokens":null,"min_tokens":500}',
    ]) {
      const body = Buffer.from(text);
      for (const maxTokensFactor of [0, 0.3, 0.7])
        expect(
          rewriteRequest(body, peekRequest(body), {
            ...basePlan,
            maxTokensFactor,
            defaultMaxTokens: 8,
          }),
        ).toBe(body);
    }
    // the instruction is still added, and nothing else
    expect(rewrite('{"model":"m","messages":[{"role":"user","content":"U"}]}', tired)).toBe(
      '{"model":"m","messages":[{"role":"user","content":"Answer concisely.\\n\\nU"}]}',
    );
  });

  it('scales whichever field was sent, and both when both were', () => {
    expect(rewrite('{"model":"m","max_completion_tokens":200}', { maxTokensFactor: 0.5 })).toBe(
      '{"model":"m","max_completion_tokens":100}',
    );
    expect(
      rewrite('{"max_tokens":200,"model":"m","max_completion_tokens":400}', {
        maxTokensFactor: 0.5,
      }),
    ).toBe('{"max_tokens":100,"model":"m","max_completion_tokens":200}');
    // one null, one sent: only the sent one is scaled, the null stays
    expect(
      rewrite('{"max_tokens":null,"model":"m","max_completion_tokens":400}', {
        maxTokensFactor: 0.5,
      }),
    ).toBe('{"max_tokens":null,"model":"m","max_completion_tokens":200}');
  });

  it("completions without max_tokens: vLLM's default of 16 is scaled, never raised", () => {
    const completion = { endpoint: 'completion' as const, defaultMaxTokens: 1024 };
    // vLLM's CompletionRequest has max_tokens = 16 when the key is absent: 0.3 x 16 floored at
    // 16 is 16, so nothing is added (it used to add 0.3 x 1024 = 307, raising the limit).
    const body = Buffer.from('{"model":"m","prompt":"Once upon"}');
    const plan = { ...basePlan, ...completion, maxTokensFactor: 0.3 };
    expect(rewriteRequest(body, peekRequest(body), plan)).toBe(body);
    // A lower floor lets the scaled default through: round(0.3 x 16) = 5.
    expect(
      rewrite('{"model":"m","prompt":"p"}', {
        ...completion,
        maxTokensFactor: 0.3,
        minMaxTokens: 1,
      }),
    ).toBe('{"model":"m","prompt":"p","max_tokens":5}');
    // max_completion_tokens is no field of vLLM's CompletionRequest: it does not stand for
    // max_tokens (scaled as sent, and ignored by vLLM), and a null one changes nothing.
    expect(
      rewrite('{"model":"m","prompt":"p","max_completion_tokens":null}', {
        ...completion,
        maxTokensFactor: 0.3,
      }),
    ).toBe('{"model":"m","prompt":"p","max_completion_tokens":null}');
    expect(
      rewrite('{"model":"m","prompt":"p","max_completion_tokens":1000}', {
        ...completion,
        maxTokensFactor: 0.3,
        minMaxTokens: 4,
      }),
    ).toBe('{"model":"m","prompt":"p","max_completion_tokens":300,"max_tokens":5}');
  });

  it('completions with "max_tokens": null: the rest of the context, so the null stays', () => {
    const completion = { endpoint: 'completion' as const, defaultMaxTokens: 1024 };
    const body = Buffer.from('{"model":"m","prompt":"p","max_tokens":null}');
    expect(
      rewriteRequest(body, peekRequest(body), { ...basePlan, ...completion, maxTokensFactor: 0.3 }),
    ).toBe(body);
    // an ignored max_completion_tokens beside it is scaled as sent; the null stays
    expect(
      rewrite('{"model":"m","max_tokens":null,"max_completion_tokens":100,"prompt":"p"}', {
        ...completion,
        maxTokensFactor: 0.3,
      }),
    ).toBe('{"model":"m","max_tokens":null,"max_completion_tokens":30,"prompt":"p"}');
  });

  it('rewrites the last of duplicate keys, the one that counts', () => {
    expect(
      rewrite('{"max_tokens":"x","model":"m","max_tokens":100}', { maxTokensFactor: 0.5 }),
    ).toBe('{"max_tokens":"x","model":"m","max_tokens":50}');
  });
});

describe('rewriteRequest: min_tokens is a floor (vLLM refuses min_tokens > max_tokens)', () => {
  const lazy: Partial<RewritePlan> = { maxTokensFactor: 0.3 };
  const messages = '"messages":[{"role":"user","content":"hi"}]';

  it('never scales a sent limit below min_tokens', () => {
    // 0.3 x 1000 = 300 would be under min_tokens 500: vLLM would answer 400 only under load.
    expect(rewrite(`{"model":"m",${messages},"min_tokens":500,"max_tokens":1000}`, lazy)).toBe(
      `{"model":"m",${messages},"min_tokens":500,"max_tokens":500}`,
    );
    expect(
      rewrite(`{"model":"m","max_completion_tokens":1000,"min_tokens":5e2,${messages}}`, lazy),
    ).toBe(`{"model":"m","max_completion_tokens":500,"min_tokens":5e2,${messages}}`);
    // a min_tokens under the scaled value changes nothing
    expect(rewrite('{"model":"m","min_tokens":100,"max_tokens":1000}', lazy)).toBe(
      '{"model":"m","min_tokens":100,"max_tokens":300}',
    );
    // completions too
    expect(
      rewrite('{"model":"m","prompt":"p","max_tokens":1000,"min_tokens":400}', {
        ...lazy,
        endpoint: 'completion',
      }),
    ).toBe('{"model":"m","prompt":"p","max_tokens":400,"min_tokens":400}');
  });

  it("floors vLLM's completions default at min_tokens; adds nothing to chat", () => {
    expect(rewrite(`{"model":"m",${messages},"min_tokens":500}`, lazy)).toBe(
      `{"model":"m",${messages},"min_tokens":500}`,
    );
    // completions without the key: vLLM's 16, floored at min_tokens 10
    expect(
      rewrite('{"model":"m","prompt":"p","min_tokens":10}', {
        ...lazy,
        endpoint: 'completion',
        minMaxTokens: 1,
      }),
    ).toBe('{"model":"m","prompt":"p","min_tokens":10,"max_tokens":10}');
  });

  it('leaves a limit already under min_tokens as it is (vLLM refuses it either way)', () => {
    const body = Buffer.from('{"model":"m","min_tokens":500,"max_tokens":400}');
    expect(rewriteRequest(body, peekRequest(body), { ...basePlan, ...lazy })).toBe(body);
    const completion = Buffer.from('{"model":"m","prompt":"p","min_tokens":500}');
    expect(
      rewriteRequest(completion, peekRequest(completion), {
        ...basePlan,
        ...lazy,
        endpoint: 'completion',
        minMaxTokens: 1,
      }),
    ).toBe(completion);
  });

  it('a null min_tokens is no floor', () => {
    expect(rewrite('{"model":"m","min_tokens":null,"max_tokens":1000}', lazy)).toBe(
      '{"model":"m","min_tokens":null,"max_tokens":300}',
    );
  });
});

// A grammar-constrained answer cut short is no shorter answer but an invalid one: JSON that does
// not parse, a tool call without its arguments (vLLM's chat serving). Such requests keep their
// token limits; the instruction is still added.
describe('rewriteRequest: requests that constrain their output keep their limits', () => {
  const lazy: Partial<RewritePlan> = { instruction: 'I', maxTokensFactor: 0.3 };
  const body = (extra: string) =>
    `{"model":"m","messages":[{"role":"user","content":"U"}],"max_tokens":100,${extra}}`;
  const instructed = (extra: string) => body(extra).replace('"U"', '"I\\n\\nU"');

  it('tool_choice required or named, response_format json, guided_*, structured_outputs', () => {
    for (const extra of [
      '"tool_choice":"required"',
      '"tool_choice":{"type":"function","function":{"name":"f"}}',
      '"response_format":{"type":"json_object"}',
      '"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{}}}',
      '"response_format":{"type":"structural_tag","format":{}}',
      '"guided_json":{"type":"object"}',
      '"guided_regex":"[a-z]+"',
      '"guided_choice":["yes","no"]',
      '"guided_grammar":"root ::= \\"a\\""',
      '"structured_outputs":{"json":{"type":"object"}}',
      // escaped keys and values are read as JSON.parse reads them
      '"tool_ch\\u006fice":"re\\u0071uired"',
      '"response_format":{"t\\u0079pe":"json_\\u006fbject"}',
    ]) {
      expect(rewrite(body(extra), lazy)).toBe(instructed(extra));
      // max_completion_tokens, and vLLM's completions default, alike
      const completion = `{"model":"m","prompt":"p",${extra}}`;
      const raw = Buffer.from(completion);
      expect(
        rewriteRequest(raw, peekRequest(raw), {
          ...basePlan,
          endpoint: 'completion',
          maxTokensFactor: 0.3,
          minMaxTokens: 1,
        }),
      ).toBe(raw);
      const both = `{"model":"m","max_completion_tokens":200,${extra},"max_tokens":100}`;
      expect(rewrite(both, { maxTokensFactor: 0.5 })).toBe(both);
    }
  });

  it('scales as before when nothing constrains the output', () => {
    for (const extra of [
      '"tool_choice":"auto"',
      '"tool_choice":"none"',
      '"tool_choice":null',
      '"response_format":{"type":"text"}',
      '"response_format":{"type":"t\\u0065xt"}',
      '"response_format":null',
      '"guided_json":null',
      '"structured_outputs":null',
      '"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"none"',
      '"tools":[]',
      '"tools":null',
      '"guided_decoding_backend":"xgrammar"',
      '"x":{"tool_choice":"required","guided_json":{}}', // nested: not the request's own
    ]) {
      expect(rewrite(body(extra), lazy)).toBe(
        instructed(extra).replace('"max_tokens":100', '"max_tokens":30'),
      );
    }
  });

  it('the last of duplicate keys counts', () => {
    const free = '"tool_choice":"required","tool_choice":"auto"';
    expect(rewrite(body(free), lazy)).toBe(
      instructed(free).replace('"max_tokens":100', '"max_tokens":30'),
    );
    const forced = '"response_format":{"type":"text"},"response_format":{"type":"json_object"}';
    expect(rewrite(body(forced), lazy)).toBe(instructed(forced));
    // within response_format too
    const type = '"response_format":{"type":"text","type":"json_object"}';
    expect(rewrite(body(type), lazy)).toBe(instructed(type));
  });

  it('finds the key after large values the peek spans (messages, tools, prompt, documents)', () => {
    const big = 'x'.repeat(70_000);
    const text = JSON.stringify({
      model: 'm',
      messages: [{ role: 'user', content: big }],
      tools: [{ type: 'function', function: { name: 'f', description: big } }],
      documents: [{ text: big }],
      prompt: [big, big],
      max_tokens: 100,
      tool_choice: { type: 'function', function: { name: 'f' } },
    });
    const raw = Buffer.from(text);
    const out = rewriteRequest(raw, peekRequest(raw), { ...basePlan, maxTokensFactor: 0.3 });
    expect(out).toBe(raw);
    // "none": the model answers in text (with "auto", the default, tools keep the limit too)
    const free = Buffer.from(text.replace(/"tool_choice":\{.*\}\}$/, '"tool_choice":"none"}'));
    expect(
      JSON.parse(
        rewriteRequest(free, peekRequest(free), { ...basePlan, maxTokensFactor: 0.3 }).toString(),
      ).max_tokens,
    ).toBe(30);
  });

  it('does not need defaultMaxTokens (no longer read)', () => {
    const { defaultMaxTokens: _unused, ...plan } = basePlan;
    const raw = Buffer.from('{"model":"m","max_tokens":100}');
    expect(
      rewriteRequest(raw, peekRequest(raw), { ...plan, maxTokensFactor: 0.5 }).toString(),
    ).toBe('{"model":"m","max_tokens":50}');
  });
});

describe('rewriteRequest: echo (completions)', () => {
  const plan: Partial<RewritePlan> = {
    endpoint: 'completion',
    instruction: 'Be brief.',
    completionPrefix: true,
    maxTokensFactor: 0.5,
  };

  it('does not prefix a prompt vLLM echoes back, and still scales max_tokens', () => {
    expect(rewrite('{"model":"m","prompt":"Once upon","echo":true,"max_tokens":100}', plan)).toBe(
      '{"model":"m","prompt":"Once upon","echo":true,"max_tokens":50}',
    );
    expect(rewrite('{"model":"m","echo":true,"prompt":["Once upon"],"max_tokens":100}', plan)).toBe(
      '{"model":"m","echo":true,"prompt":["Once upon"],"max_tokens":50}',
    );
    // vLLM's pydantic reads 1, "yes", "true" as true too; a value it refuses counts as on.
    for (const echo of ['1', '"yes"', '"true"', '"On"', '"maybe"']) {
      const body = `{"model":"m","prompt":"p","echo":${echo},"max_tokens":100}`;
      expect(rewrite(body, plan)).toBe(body.replace('100', '50'));
    }
  });

  it('prefixes as before when echo is false or null, as pydantic reads a bool', () => {
    for (const echo of ['false', 'null', '0', '"false"', '"no"', '"OFF"']) {
      expect(rewrite(`{"model":"m","prompt":"p","echo":${echo}}`, plan)).toBe(
        `{"model":"m","prompt":"Be brief.\\n\\np","echo":${echo}}`,
      );
    }
    // the last of duplicate keys counts
    expect(rewrite('{"model":"m","echo":true,"prompt":"p","echo":false}', plan)).toBe(
      '{"model":"m","echo":true,"prompt":"Be brief.\\n\\np","echo":false}',
    );
  });
});

// vLLM defaults tool_choice to "auto" whenever `tools` comes without it (`check_tool_usage`,
// vllm/entrypoints/openai/chat_completion/protocol.py), and parses the answer for tool calls
// unless tool_choice is "none": a call cut mid-JSON reaches the client as raw text with
// finish_reason "length". Such a request keeps its limits; the instruction is still added.
describe('rewriteRequest: chat with tools keeps its limits unless tool_choice is "none"', () => {
  const plan: Partial<RewritePlan> = {
    instruction: 'Provide extremely short answers only.',
    completionPrefix: true,
    maxTokensFactor: 0.3,
    minMaxTokens: 16,
  };
  const tools = '[{"type":"function","function":{"name":"get_weather","parameters":{}}}]';
  const body = (extra: string) =>
    `{"model":"m","messages":[{"role":"user","content":"weather in Paris?"}],"tools":${tools},"max_tokens":200${extra}}`;
  const instructed = (extra: string) =>
    body(extra).replace(
      '"weather in Paris?"',
      '"Provide extremely short answers only.\\n\\nweather in Paris?"',
    );

  it("keeps max_tokens when tool_choice is left out (the reviewer's case: it was cut to 60)", () => {
    expect(rewrite(body(''), plan)).toBe(instructed(''));
  });

  it('keeps it with tool_choice "auto", null, "required" or a named tool; scales it with "none"', () => {
    for (const extra of [
      ',"tool_choice":"auto"',
      ',"tool_choice":null', // vLLM's streaming path still parses tool calls then
      ',"tool_choice":"required"',
      ',"tool_choice":{"type":"function","function":{"name":"get_weather"}}',
      ',"tool_choice":"\\u0061uto"',
      ',"max_completion_tokens":300',
    ]) {
      expect(rewrite(body(extra), plan)).toBe(instructed(extra));
    }
    // "none": the answer is text, and is scaled as any other
    for (const extra of [',"tool_choice":"none"', ',"tool_choice":"n\\u006fne"']) {
      expect(rewrite(body(extra), plan)).toBe(
        instructed(extra).replace('"max_tokens":200', '"max_tokens":60'),
      );
    }
  });

  it('the last tool_choice counts', () => {
    const none = ',"tool_choice":"auto","tool_choice":"none"';
    expect(rewrite(body(none), plan)).toBe(
      instructed(none).replace('"max_tokens":200', '"max_tokens":60'),
    );
    const auto = ',"tool_choice":"none","tool_choice":"auto"';
    expect(rewrite(body(auto), plan)).toBe(instructed(auto));
  });

  it('counts only a non-empty tools array, and only on chat (completions have no tools)', () => {
    const list = `[ ${tools.slice(1)}`;
    expect(rewrite(body('').replace(tools, list), plan)).toBe(instructed('').replace(tools, list));
    for (const list of ['[]', '[ ]', 'null']) {
      const text = body('').replace(tools, list);
      expect(rewrite(text, plan)).toBe(
        instructed('').replace(tools, list).replace('"max_tokens":200', '"max_tokens":60'),
      );
    }
    const completion = `{"model":"m","prompt":"p","tools":${tools},"max_tokens":200}`;
    expect(rewrite(completion, { ...plan, endpoint: 'completion' })).toBe(
      completion
        .replace('"p"', '"Provide extremely short answers only.\\n\\np"')
        .replace('200', '60'),
    );
  });
});

// With these, vLLM hands the client back (or scores, or cuts) the prompt it is given: an
// instruction in it would read as part of the client's own prompt. The limit is still scaled.
describe('rewriteRequest: no instruction where vLLM returns or truncates the prompt', () => {
  const plan: Partial<RewritePlan> = {
    instruction: 'Be brief.',
    completionPrefix: true,
    maxTokensFactor: 0.5,
    minMaxTokens: 1,
  };
  const chat = (extra: string) =>
    `{"model":"m","messages":[{"role":"user","content":"U"}],"max_tokens":100,${extra}}`;
  const completion = (extra: string) => `{"model":"m","prompt":"U","max_tokens":100,${extra}}`;
  const scaled = (text: string) => text.replace('"max_tokens":100', '"max_tokens":50');
  const instructed = (text: string) => scaled(text).replace('"U"', '"Be brief.\\n\\nU"');

  it("the reviewer's case: a completion with prompt_logprobs 0", () => {
    const body =
      '{"model":"m","prompt":"The capital of France is Paris","max_tokens":1,"prompt_logprobs":0}';
    expect(rewrite(body, { ...plan, endpoint: 'completion' })).toBe(body);
  });

  // Each field on (no instruction), then off or not the request's (the instruction as before).
  it.each([
    ['"prompt_logprobs":0', '"prompt_logprobs":null'],
    ['"prompt_logprobs":-1', '"x":{"prompt_logprobs":0,"echo":true}'], // nested
    ['"prompt_logprobs":5', '"prompt_logprobs":0,"prompt_logprobs":null'], // the last counts
    ['"prompt_l\\u006fgprobs":0', '"prompt_logprobs":null'],
    ['"return_token_ids":true', '"return_token_ids":false'],
    ['"return_token_ids":"yes"', '"return_token_ids":"no"'],
    ['"return_token_ids":1', '"return_token_ids":0'],
    ['"return_token_ids":"maybe"', '"return_token_ids":null'], // refused by vLLM: on
    ['"truncate_prompt_tokens":100', '"truncate_prompt_tokens":null'],
    ['"truncate_prompt_tokens":-1', '"truncate_prompt_tokens":null'],
    ['"truncate_prompt_tokens":0', '"truncate_prompt_tokens":null'],
    ['"echo":true', '"echo":false'],
    ['"echo":"True"', '"echo":"off"'],
  ])(
    '%s: no instruction on either endpoint, max_tokens still scaled; %s: the instruction',
    (on, off) => {
      expect(rewrite(chat(on), plan)).toBe(scaled(chat(on)));
      expect(rewrite(completion(on), { ...plan, endpoint: 'completion' })).toBe(
        scaled(completion(on)),
      );
      expect(rewrite(chat(off), plan)).toBe(instructed(chat(off)));
      expect(rewrite(completion(off), { ...plan, endpoint: 'completion' })).toBe(
        instructed(completion(off)),
      );
    },
  );

  it('chat echo with add_generation_prompt false (vLLM echoes the last message)', () => {
    const extra = '"add_generation_prompt":false,"echo":true';
    expect(rewrite(chat(extra), plan)).toBe(scaled(chat(extra)));
    // and into a system message as well
    const system = `{"model":"m","messages":[{"role":"system","content":"S"},{"role":"user","content":"U"}],"echo":true}`;
    expect(rewrite(system, plan)).toBe(system);
  });

  it('return_prompt_text: chat only (completions have no such field)', () => {
    const extra = '"return_prompt_text":true';
    expect(rewrite(chat(extra), plan)).toBe(scaled(chat(extra)));
    expect(rewrite(completion(extra), { ...plan, endpoint: 'completion' })).toBe(
      instructed(completion(extra)),
    );
    const off = '"return_prompt_text":"false"';
    expect(rewrite(chat(off), plan)).toBe(instructed(chat(off)));
  });
});

// vLLM's pydantic reads "100" (and true) in an int field as the integer: the rewrite scales
// such a limit like a number, and writes the number back (pydantic takes it as well).
describe("rewriteRequest: limits sent as strings or booleans, as vLLM's pydantic reads them", () => {
  const lazy: Partial<RewritePlan> = { maxTokensFactor: 0.3, minMaxTokens: 16 };

  it('scales a string limit and writes a number over it', () => {
    expect(rewrite('{"model":"m","max_tokens":"200"}', lazy)).toBe('{"model":"m","max_tokens":60}');
    expect(rewrite('{"model":"m","max_tokens":" 1_000 \\n"}', lazy)).toBe(
      '{"model":"m","max_tokens":300}',
    );
    expect(rewrite('{"model":"m","max_completion_tokens":"+100.0","max_tokens":"100"}', lazy)).toBe(
      '{"model":"m","max_completion_tokens":30,"max_tokens":30}',
    );
    expect(
      rewrite('{"model":"m","prompt":"p","max_tokens":"\\u0032\\u0030\\u0030"}', {
        ...lazy,
        endpoint: 'completion',
      }),
    ).toBe('{"model":"m","prompt":"p","max_tokens":60}');
  });

  it('floors at a min_tokens sent as a string', () => {
    expect(rewrite('{"model":"m","max_tokens":"1000","min_tokens":"500"}', lazy)).toBe(
      '{"model":"m","max_tokens":500,"min_tokens":"500"}',
    );
  });

  it('leaves a limit that does not change as the client wrote it', () => {
    for (const text of [
      '{"model":"m","max_tokens":"10"}',
      '{"model":"m","max_tokens":true}',
      '{"model":"m","max_tokens":"0"}',
    ]) {
      const body = Buffer.from(text);
      expect(rewriteRequest(body, peekRequest(body), { ...basePlan, ...lazy })).toBe(body);
    }
  });

  it('keeps string stream and n as they are: vLLM reads them', () => {
    const text = '{"model":"m","stream":"true","n":"2","max_tokens":"100"}';
    const out = Buffer.from(rewrite(text, lazy));
    expect(out.toString()).toBe('{"model":"m","stream":"true","n":"2","max_tokens":30}');
    expect(peekRequest(out)).toMatchObject({ stream: true, n: 2, maxTokens: 30 });
  });
});

describe('rewriteRequest: everything at once, bytes outside the edits unchanged', () => {
  it('splices in body order and copies every other byte as it is', () => {
    const head = '{ "model" : "m\\u00e9",\n  "max_tokens" : ';
    const mid =
      ',\n  "stream": true, "x": {"messages": [1]},\n  "messages" : [ \t{"role":"system", "content" : "S \\ud83d\\ude00';
    const tail = '"}, {"role":"user","content":"é 中 \\"q\\""} ],\n  "temperature": 0.2\n}\n';
    const body = Buffer.from(`${head}1000${mid}${tail}`);
    const out = rewriteRequest(body, peekRequest(body), {
      ...basePlan,
      ...tired,
      systemPrompt: 'append',
    });
    const added = '\\n\\nAnswer concisely.';
    expect(out.toString()).toBe(`${head}700${mid}${added}${tail}`);
    // the same, checked as byte segments
    const h = Buffer.byteLength(head);
    const m = Buffer.byteLength(mid);
    expect(out.subarray(0, h).equals(body.subarray(0, h))).toBe(true);
    expect(out.subarray(h + 3, h + 3 + m).equals(body.subarray(h + 4, h + 4 + m))).toBe(true);
    const t = Buffer.byteLength(tail);
    expect(out.subarray(out.length - t).equals(body.subarray(body.length - t))).toBe(true);
    expect(JSON.parse(out.toString()).messages[0].content).toBe('S 😀\n\nAnswer concisely.');
  });
});

describe('plannedMaxTokens', () => {
  const plan = { ...basePlan, maxTokensFactor: 0.7, minMaxTokens: 16, defaultMaxTokens: 1000 };
  it('is what the rewrite sets', () => {
    expect(plannedMaxTokens(100, plan)).toBe(70);
    expect(plannedMaxTokens(20, plan)).toBe(16);
    expect(plannedMaxTokens(10, plan)).toBe(10);
    expect(plannedMaxTokens(0, plan)).toBe(0);
    expect(plannedMaxTokens(undefined, plan)).toBeUndefined();
    expect(plannedMaxTokens(15, { ...plan, maxTokensFactor: 0.5 })).toBe(15);
    expect(plannedMaxTokens(35, { ...plan, maxTokensFactor: 0.5 })).toBe(18);
    expect(plannedMaxTokens(100, { ...plan, maxTokensFactor: 1 })).toBe(100);
    expect(plannedMaxTokens(undefined, { ...plan, maxTokensFactor: 1 })).toBeUndefined();
    expect(plannedMaxTokens(100, { ...plan, maxTokensFactor: 2 })).toBe(100);
  });
  it("is never below the request's min_tokens, nor above the original", () => {
    expect(plannedMaxTokens(1000, plan, 800)).toBe(800);
    expect(plannedMaxTokens(1000, plan, 100)).toBe(700);
    expect(plannedMaxTokens(500, plan, 800)).toBe(500);
    expect(plannedMaxTokens(undefined, plan, 800)).toBeUndefined();
    expect(plannedMaxTokens(VLLM_COMPLETION_MAX_TOKENS, plan)).toBe(16);
    expect(plannedMaxTokens(VLLM_COMPLETION_MAX_TOKENS, { ...plan, minMaxTokens: 1 }, 12)).toBe(12);
  });
});

describe('bad input', () => {
  const body = Buffer.from('{"model":"m","messages":[],"max_tokens":5}');
  const peeked = peekRequest(body);

  it('refuses a plan out of range with a RangeError', () => {
    for (const bad of [
      { maxTokensFactor: Number.NaN },
      { maxTokensFactor: -0.1 },
      { maxTokensFactor: Infinity },
      { minMaxTokens: 0 },
      { minMaxTokens: 1.5 },
      { defaultMaxTokens: 0 },
      { defaultMaxTokens: 1.5 },
      { instruction: 5 as unknown as string },
    ]) {
      expect(() => rewriteRequest(body, peeked, { ...basePlan, ...bad })).toThrow(RangeError);
    }
    expect(() => plannedMaxTokens(5, { ...basePlan, maxTokensFactor: -1 })).toThrow(RangeError);
  });

  it('refuses a peek of another body', () => {
    const other = Buffer.from(' {"model":"m","messages":[],"max_tokens":5}');
    expect(() => rewriteRequest(other, peeked, { ...basePlan, maxTokensFactor: 0.5 })).toThrow(
      /does not match this body/,
    );
    const short = Buffer.from('{"model":"m"}');
    expect(() => rewriteRequest(short, peeked, basePlan)).toThrow(RangeError);
  });
});
