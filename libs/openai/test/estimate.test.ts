import { Buffer } from 'node:buffer';
import fc from 'fast-check';
import type { JsonValue } from 'fast-check';
import { describe, expect, it } from 'vitest';
import { estimatePromptTokens, peekRequest, RequestPeekError } from '../src/index.js';
import type { PeekedRequest } from '../src/index.js';
import { anyString, Members, message, requestMembers, serialize, style } from './arbitraries.js';
import type { Style } from './arbitraries.js';
import { bytes } from './helpers.js';

type Endpoint = 'chat' | 'completion';

/** Peeks `text` and estimates it for `endpoint`. */
const estimate = (text: string | Uint8Array, endpoint: Endpoint): number => {
  const body = typeof text === 'string' ? bytes(text) : text;
  return estimatePromptTokens(body, peekRequest(body), endpoint);
};
const chat = (messages: string): number => estimate(`{"model":"m","messages":${messages}}`, 'chat');
const completion = (prompt: string): number =>
  estimate(`{"model":"m","prompt":${prompt}}`, 'completion');

// The reference: JSON.parse, then the README's rules on the parsed value.

/** Code points of the string values in `v` (object keys excluded). */
function codePoints(v: unknown): number {
  if (typeof v === 'string') return [...v].length;
  if (Array.isArray(v)) return v.reduce((sum: number, x) => sum + codePoints(x), 0);
  if (v !== null && typeof v === 'object') return codePoints(Object.values(v));
  return 0;
}

/** What one image, audio or video item counts, in characters (1,024 tokens). */
const MEDIA_CHARS = 4096;

/** Keys whose value vLLM reads as one image, audio or video item (vllm/entrypoints/chat_utils.py). */
const MEDIA_KEYS = [
  'image_url',
  'video_url',
  'audio_url',
  'input_audio',
  'image_embeds',
  'audio_embeds',
];

/**
 * Code points of the string values of `messages`, except a media item, which counts
 * MEDIA_CHARS: the value of a media key, whatever it is, and a string longer than MEDIA_CHARS
 * that is the value of a key `data`.
 */
function messageChars(v: unknown, key?: string): number {
  if (key !== undefined && MEDIA_KEYS.includes(key)) return MEDIA_CHARS;
  if (typeof v === 'string') {
    const n = [...v].length;
    return n > MEDIA_CHARS && key === 'data' ? MEDIA_CHARS : n;
  }
  if (Array.isArray(v)) return v.reduce((sum: number, x) => sum + messageChars(x), 0);
  if (v !== null && typeof v === 'object')
    return Object.entries(v).reduce((sum, [k, x]) => sum + messageChars(x, k), 0);
  return 0;
}

/** A prompt: each string ceil(code points / 4), each number 1, whatever the nesting. */
function promptTokens(v: unknown): number {
  if (typeof v === 'string') return Math.ceil([...v].length / 4);
  if (typeof v === 'number') return 1;
  if (Array.isArray(v)) return v.reduce((sum: number, x) => sum + promptTokens(x), 0);
  if (v !== null && typeof v === 'object') return promptTokens(Object.values(v));
  return 0;
}

/** Code points of every string in `v`, object keys included: a tool definition as templates write it. */
function allCodePoints(v: unknown): number {
  if (typeof v === 'string') return [...v].length;
  if (Array.isArray(v)) return v.reduce((sum: number, x) => sum + allCodePoints(x), 0);
  if (v !== null && typeof v === 'object')
    return Object.entries(v).reduce((sum, [k, x]) => sum + [...k].length + allCodePoints(x), 0);
  return 0;
}

/** Object members in `v`, all levels. */
function keyCount(v: unknown): number {
  if (Array.isArray(v)) return v.reduce((sum: number, x) => sum + keyCount(x), 0);
  if (v !== null && typeof v === 'object') {
    return Object.keys(v).length + keyCount(Object.values(v));
  }
  return 0;
}

/**
 * Chat reads messages and the tool definitions (`tools`, `documents`), completions prompt only,
 * as vLLM's request models and chat templates do.
 */
function referenceEstimate(body: Uint8Array, endpoint: Endpoint): number {
  const parsed = JSON.parse(Buffer.from(body).toString('utf8')) as Record<string, unknown>;
  const get = (key: string): unknown => (Object.hasOwn(parsed, key) ? parsed[key] : undefined);
  if (endpoint === 'chat') {
    const messages = get('messages');
    const template = get('chat_template');
    const chars =
      (Array.isArray(messages) ? messageChars(messages) : 0) +
      allCodePoints(get('tools')) +
      allCodePoints(get('documents')) +
      allCodePoints(get('chat_template_kwargs')) +
      (template === undefined || template === null ? 0 : codePoints(template));
    return Math.ceil(chars / 4);
  }
  const prompt = get('prompt');
  return prompt !== undefined && prompt !== null ? promptTokens(prompt) : 0;
}

describe('estimatePromptTokens: worked examples', () => {
  it('chat: the characters of every string value in messages, over 4, rounded up', () => {
    // "user" (4) + "Hello, world" (12) = 16 characters.
    expect(chat('[{"role":"user","content":"Hello, world"}]')).toBe(4);
    // + "!" = 17: rounded up.
    expect(chat('[{"role":"user","content":"Hello, world!"}]')).toBe(5);
    // Summed over messages before rounding: "system" + "Be brief." + "user" + "Hi" = 21.
    expect(chat('[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}]')).toBe(
      6,
    );
    // Text parts: every string value counts, "type" and "text" values included.
    // "user" + "text" + "abcd" = 12.
    expect(chat('[{"role":"user","content":[{"type":"text","text":"abcd"}]}]')).toBe(3);
  });

  it('chat: object keys never count, escaped, spaced or repeated', () => {
    // Only the values: "a" + "b" = 2 characters.
    expect(chat('[{"role":"a","content":"b"}]')).toBe(1);
    expect(chat('[{"r\\u006fle":"a","a-very-long-key-name-indeed":"b"}]')).toBe(1);
    expect(chat('[ { "role" \n : "a" , "content"\t:\r\n"b" } ]')).toBe(1);
    // Duplicate keys: every value in the bytes counts, though JSON.parse keeps only the last.
    expect(chat('[{"content":"abcd","content":"efgh"}]')).toBe(2);
    // A value that looks like a key still counts: "role" (4) + "content" (7) = 11.
    expect(chat('[{"x":"role","y":"content"}]')).toBe(3);
  });

  it('chat: escapes and UTF-8 are counted as code points', () => {
    // Each of these is exactly 4 code points: one token, and two with one more character.
    const one = (content: string) => [
      chat(`[{"content":"${content}"}]`),
      chat(`[{"content":"${content}a"}]`),
    ];
    expect(one('a\\nbc')).toEqual([1, 2]); // \n is one
    expect(one('a\\"\\\\\\/')).toEqual([1, 2]); // \" \\ \/
    expect(one('\\b\\f\\r\\t')).toEqual([1, 2]);
    expect(one('caf\\u00e9')).toEqual([1, 2]); // \u00e9
    expect(one('café')).toEqual([1, 2]); // é is 2 bytes
    expect(one('ab中c')).toEqual([1, 2]); // 中 is 3 bytes
    expect(one('ab😀c')).toEqual([1, 2]); // 😀 is 4 bytes
    expect(one('ab\\ud83d\\ude00c')).toEqual([1, 2]); // a surrogate pair is one
    expect(one('ab\\uD83D\\uDE00c')).toEqual([1, 2]); // in upper case too
    expect(one('\\ud83d\\ud83d\\ude00cd')).toEqual([1, 2]); // lone high, a pair, c, d
    expect(one('\\ude00\\ud83dxy')).toEqual([1, 2]); // low then high: two lone surrogates
    expect(one('a\\ud83dbc')).toEqual([1, 2]); // a lone high surrogate is one
    expect(one('\\udbff\\udfffabc')).toEqual([1, 2]); // the last pair: one
    expect(one('\\ud800\\udc00abc')).toEqual([1, 2]); // the first pair: one
    expect(one('\\ud83d\\udbffab')).toEqual([1, 2]); // high then high: two
    expect(one('\\ud7ff\\udc00ab')).toEqual([1, 2]); // not a surrogate, then a lone low
    expect(one('\\ude00\\ude00ab')).toEqual([1, 2]); // low then low: two
    expect(one('\\ud83d\\u0041ab')).toEqual([1, 2]); // high then 'A': two
    expect(chat('[{"content":"abcde"}]')).toBe(2);
    expect(chat('[{"content":"ab\\ud83d\\ude00\\u00e9é中"}]')).toBe(2); // 7 code points
  });

  it('chat: numbers, booleans and nulls count nothing', () => {
    expect(
      chat(
        '[{"role":"ab","content":null,"n":12345678,"x":-1.5e10,"ok":true,"no":false,' +
          '"tool_calls":[{"id":"cd","index":0,"function":{"arguments":{}}}]}]',
      ),
    ).toBe(1);
  });

  it('chat: empty or value-less messages estimate 0', () => {
    expect(chat('[]')).toBe(0);
    expect(chat('[{}]')).toBe(0);
    expect(chat('[{"role":"","content":""}]')).toBe(0);
    expect(chat('[null, 1, true, [], {"a":[]}]')).toBe(0);
  });

  it('chat: tools and documents count, keys included, summed with messages before rounding', () => {
    const withTools = (members: string) =>
      estimate(`{"model":"m","messages":[{"role":"user","content":"hi"}],${members}}`, 'chat');
    // "user" + "hi" = 6 characters alone: 2 tokens.
    expect(chat('[{"role":"user","content":"hi"}]')).toBe(2);
    // + "type" "function" "function" "name" "f" "description" "abcd" = 4+8+8+4+1+11+4 = 40.
    expect(
      withTools('"tools":[{"type":"function","function":{"name":"f","description":"abcd"}}]'),
    ).toBe(Math.ceil(46 / 4));
    // RAG documents count the same way: + "name" "g" "parameters" "type" "object" = 4+1+10+4+6 = 25.
    expect(withTools('"documents":[{"name":"g","parameters":{"type":"object"}}]')).toBe(
      Math.ceil(31 / 4),
    );
    // Both, in either order, and null as absent.
    expect(withTools('"documents":[{"name":"g"}],"tools":[{"name":"f"}]')).toBe(
      Math.ceil((6 + 5 + 5) / 4),
    );
    expect(withTools('"tools":null,"documents":null')).toBe(2);
    // Numbers and literals in a schema count nothing; escapes and UTF-8 as code points.
    expect(withTools('"tools":[{"minimum":0,"strict":true,"x":null,"d":"caf\\u00e9 中"}]')).toBe(
      Math.ceil((6 + 7 + 6 + 1 + 1 + 6) / 4),
    );
    // Only the last of duplicate top-level keys, as JSON.parse keeps.
    expect(withTools('"tools":["abcdefghijklmnop"],"tools":["ab"]')).toBe(2);
  });

  it('chat: a long tool description is a long prompt, however short the messages', () => {
    // The reported case: 40,000 characters of description beside "hi" were estimated as 2
    // tokens; the chat template writes them into the prompt the engine prefills.
    const description = 'x'.repeat(40_000);
    const tools = `[{"type":"function","function":{"name":"lookup","description":"${description}","parameters":{"type":"object","properties":{}}}}]`;
    const body = `{"model":"m","messages":[{"role":"user","content":"hi"}],"tools":${tools}}`;
    expect(estimate(body, 'chat')).toBeGreaterThanOrEqual(10_000);
    expect(estimate(body, 'chat')).toBe(referenceEstimate(bytes(body), 'chat'));
    const rag = `{"model":"m","messages":[{"role":"user","content":"hi"}],"documents":[{"title":"lookup","text":"${description}"}]}`;
    expect(estimate(rag, 'chat')).toBeGreaterThanOrEqual(10_000);
    // OpenAI's legacy `functions` is not a field of vLLM's ChatCompletionRequest: ignored, it
    // never reaches the prompt, so it is not counted.
    const legacy = `{"model":"m","messages":[{"role":"user","content":"hi"}],"functions":[{"name":"lookup","description":"${description}"}]}`;
    expect(estimate(legacy, 'chat')).toBe(
      estimate('{"model":"m","messages":[{"role":"user","content":"hi"}]}', 'chat'),
    );
    // A completions request has no tools (vLLM's CompletionRequest ignores the field).
    expect(estimate(`{"model":"m","prompt":"hi","tools":${tools}}`, 'completion')).toBe(1);
  });

  it('chat: an image, audio or video item counts 1,024 tokens, not its base64', () => {
    const base64 = 'A'.repeat(400_000);
    const image = (url: string) =>
      `[{"role":"user","content":[{"type":"text","text":"what is this?"},{"type":"image_url","image_url":{"url":"${url}"}}]}]`;
    // The string values: role, the parts' types, the text, the item.
    expect(chat(image(`data:image/png;base64,${base64}`))).toBe(
      Math.ceil((4 + 4 + 13 + 9 + 4096) / 4),
    );
    // However small: the processor resizes an image to its patches whatever its file.
    expect(chat(image('data:image/png;base64,AAAA'))).toBe(Math.ceil((4 + 4 + 13 + 9 + 4096) / 4));
    const audio = `[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"${base64}","format":"wav"}}]}]`;
    expect(chat(audio)).toBe(Math.ceil((4 + 11 + 4096) / 4));
    // A long base64 string under a key `data` elsewhere (a prompt_embeds part) is no text.
    const embeds = `[{"role":"user","content":[{"type":"prompt_embeds","data":"${base64}"}]}]`;
    expect(chat(embeds)).toBe(Math.ceil((4 + 13 + 4096) / 4));
    // Only the value right after the key `data` is one: text after it counts as text.
    const after = `[{"role":"user","content":[{"data":1,"x":"${'y'.repeat(5000)}"}]}]`;
    expect(chat(after)).toBe(Math.ceil((4 + 5000) / 4));
    // Text that starts with `data:` (a pasted event stream) is text, wherever it sits.
    const pasted = `data: ${'lorem '.repeat(20_000)}`;
    expect(chat(`[{"role":"user","content":"${pasted}"}]`)).toBe(Math.ceil((4 + 120_006) / 4));
    expect(chat(`[{"role":"user","content":[{"type":"text","text":"${pasted}"}]}]`)).toBe(
      Math.ceil((4 + 4 + 120_006) / 4),
    );
    expect(chat(`[{"role":"user","content":[{"type":"text","text":"x","url":"${pasted}"}]}]`)).toBe(
      Math.ceil((4 + 4 + 1 + 120_006) / 4),
    );
  });

  it('chat: media the engine fetches by URL counts as much as media sent inline', () => {
    // The engine downloads an http(s) URL and prefills the item's tokens all the same: counted
    // as the URL's characters, 10 images estimated 94 tokens, charged and laned as a "hi".
    const part = (type: string, value: string) => `{"type":"${type}","${type}":${value}}`;
    const url = (u: string) => `{"url":"${u}"}`;
    const parts = [
      part('image_url', url('https://example.com/cat.jpg')),
      part('image_url', url('http://10.0.0.5/scan.png')),
      part('image_url', url('file:///data/images/1.png')), // --allowed-local-media-path
      part('video_url', url('https://example.com/clip.mp4')),
      part('audio_url', url('https://example.com/talk.mp3')),
      part('input_audio', '{"data":"UklGRg==","format":"wav"}'),
      part('image_embeds', '"AAAA"'),
      part('audio_embeds', '{"audio_embeds":"AAAA"}'),
      // An input_image part (the Responses API's shape) and a part without a type: a string.
      '{"type":"input_image","image_url":"https://example.com/a.jpg"}',
      '{"image_url":"https://example.com/b.jpg"}',
      '{"video_url":"https://example.com/c.mp4"}',
      // A cached item named by its uuid alone.
      '{"type":"image_url","image_url":null,"uuid":"sha256-of-the-image"}',
    ];
    for (const p of parts) {
      const messages = `[{"role":"user","content":[${p}]}]`;
      const body = bytes(`{"model":"m","messages":${messages}}`);
      const tokens = estimatePromptTokens(body, peekRequest(body), 'chat');
      expect(tokens, p).toBeGreaterThanOrEqual(1024);
      expect(tokens, p).toBeLessThan(1024 + 20);
      expect(tokens, p).toBe(referenceEstimate(body, 'chat'));
    }
    // Ten images by URL: ten items.
    const ten = Array.from({ length: 10 }, (_, k) =>
      part('image_url', url(`https://example.com/${k}.jpg`)),
    );
    expect(chat(`[{"role":"user","content":[${ten.join(',')}]}]`)).toBe(
      Math.ceil((4 + 10 * (9 + 4096)) / 4),
    );
    // The key as JSON.parse reads it, escaped or spaced.
    expect(
      chat('[{"role":"user","content":[{"image\\u005furl" : {"url":"https://e.com/x.jpg"}}]}]'),
    ).toBe(Math.ceil((4 + 4096) / 4));
    // Strings after the item count again, and nothing of the item leaks into them.
    expect(
      chat(
        '[{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://e.com/\\"}]\\"x"}},{"type":"text","text":"abcd"}]}]',
      ),
    ).toBe(Math.ceil((4 + 9 + 4096 + 4 + 4) / 4));
  });

  it("chat: chat_template_kwargs and chat_template count, as vLLM merges them into the template's arguments", () => {
    const doc = 'z'.repeat(200_000);
    const body = (extra: string) =>
      `{"model":"m","messages":[{"role":"user","content":"hi"}],${extra}}`;
    expect(estimate(body(`"chat_template_kwargs":{"documents":[{"text":"${doc}"}]}`), 'chat')).toBe(
      Math.ceil((4 + 2 + 9 + 4 + 200_000) / 4),
    );
    expect(estimate(body(`"chat_template":"{{ '${'w'.repeat(4000)}' }}"`), 'chat')).toBe(
      Math.ceil((4 + 2 + 4008) / 4),
    );
    expect(estimate(body('"chat_template_kwargs":null,"chat_template":null'), 'chat')).toBe(2);
  });

  it('completions: a string prompt is its characters over 4, rounded up', () => {
    expect(completion('"abcdefgh"')).toBe(2);
    expect(completion('"abcdefghi"')).toBe(3);
    expect(completion('"caf\\u00e9 \\ud83d\\ude00 中"')).toBe(2); // 8 code points
    expect(completion('""')).toBe(0);
  });

  it('completions: token ids count one each', () => {
    expect(completion('[1,2,3]')).toBe(3);
    expect(completion('[ 0 , 128000 ,\n 42 ]')).toBe(3);
    expect(completion('[]')).toBe(0);
  });

  it('completions: an array of strings is the sum of each string estimate', () => {
    // ceil(5 / 4) + ceil(2 / 4) + ceil(0 / 4) = 2 + 1 + 0.
    expect(completion('["abcde","ab",""]')).toBe(3);
  });

  it('completions: an array of arrays of ids is the total number of ids', () => {
    expect(completion('[[1,2],[3],[]]')).toBe(3);
  });

  it('completions: other shapes vLLM refuses follow the same rules, keys excluded', () => {
    expect(completion('7')).toBe(1);
    expect(completion('1e2')).toBe(1);
    expect(completion('[1.5,-0,1E+2]')).toBe(3);
    expect(completion('true')).toBe(0);
    expect(completion('{"abcdefgh":"abcde","n":1}')).toBe(3);
    expect(completion('["abcde",[1,2],null,false]')).toBe(4);
  });

  it("the endpoint's field only: chat reads messages, completions read prompt", () => {
    for (const endpoint of ['chat', 'completion'] as const) {
      expect(estimate('{"model":"m"}', endpoint)).toBe(0);
      expect(estimate('{"model":"m","messages":null,"prompt":null}', endpoint)).toBe(0);
    }
    const both = '{"model":"m","messages":[{"content":"a"}],"prompt":[1,2,3]}';
    expect(estimate(both, 'chat')).toBe(1);
    expect(estimate(both, 'completion')).toBe(3);
    // A field the endpoint does not read counts nothing, as vLLM ignores it.
    expect(estimate('{"model":"m","prompt":"abcde"}', 'chat')).toBe(0);
    expect(estimate('{"model":"m","messages":[{"content":"abcde"}]}', 'completion')).toBe(0);
    // Other members are not looked at.
    expect(
      estimate('{"model":"a long model name","prompt":"ab","suffix":"abcdefgh"}', 'completion'),
    ).toBe(1);
  });

  it('completions: an empty messages array does not hide a long prompt', () => {
    // vLLM's CompletionRequest has no messages field: it reads the 200,000-character prompt.
    const prompt = 'x'.repeat(200_000);
    expect(estimate(`{"model":"m","prompt":"${prompt}","messages":[]}`, 'completion')).toBe(50_000);
    expect(estimate(`{"model":"m","messages":[],"prompt":"${prompt}"}`, 'completion')).toBe(50_000);
    // and for chat, a long prompt beside the messages is not the chat's
    expect(estimate(`{"model":"m","messages":[],"prompt":"${prompt}"}`, 'chat')).toBe(0);
  });

  it('never throws and always ends, whatever the bytes and spans', () => {
    const bodies = fc.oneof(
      fc.uint8Array({ maxLength: 64 }),
      fc.string({ unit: 'binary' }).map(bytes),
      fc
        .array(
          fc.constantFrom('"', '\\', '\\u', '\\ud83d', '\\ude00', ':', 'a', 'é', '1', '-', ' '),
        )
        .map((parts) => bytes(parts.join(''))),
    );
    const position = fc.oneof(
      fc.integer({ min: -5, max: 80 }),
      fc.constantFrom(Number.NaN, Infinity, -Infinity, 1.5, 2 ** 53),
    );
    fc.assert(
      fc.property(bodies, position, position, fc.boolean(), (body, start, end, asPrompt) => {
        const span = { start, end };
        const peeked = {
          messages: asPrompt ? undefined : span,
          prompt: asPrompt ? span : undefined,
          tools: asPrompt ? undefined : span,
          documents: asPrompt ? undefined : { start: end, end: start },
        } as unknown as PeekedRequest;
        const got = estimatePromptTokens(body, peeked, asPrompt ? 'completion' : 'chat');
        expect(Number.isSafeInteger(got)).toBe(true);
        expect(got).toBeGreaterThanOrEqual(0);
      }),
      { numRuns: 3000 },
    );
  });
});

describe('estimatePromptTokens agrees with JSON.parse', () => {
  const check = (body: Uint8Array, endpoint: Endpoint): void => {
    expect(estimatePromptTokens(body, peekRequest(body), endpoint)).toBe(
      referenceEstimate(body, endpoint),
    );
  };
  /**
   * Checks `{"model":"m", <field>: value}` written in style `s`. The serializer escapes a
   * surrogate pair half by half, and a raw lone half is written as U+FFFD, so two keys of one
   * object can become duplicates; JSON.parse then drops a value the estimate still counts (see
   * the duplicate-key example), so such a body says nothing here and is skipped.
   */
  const checkField = (field: 'messages' | 'prompt', value: JsonValue, s: Style): void => {
    const body = bytes(
      serialize(
        new Members([
          ['model', 'm'],
          [field, value],
        ]),
        s,
      ),
    );
    const parsed = JSON.parse(Buffer.from(body).toString('utf8')) as Record<string, unknown>;
    fc.pre(keyCount(parsed[field]) === keyCount(value));
    check(body, field === 'messages' ? 'chat' : 'completion');
  };
  const unicode = fc.oneof(
    anyString,
    fc.string({ unit: 'grapheme' }),
    fc.string({ unit: 'binary' }),
    fc.string({ unit: 'binary-ascii' }),
  );
  /**
   * An image, audio or video part: the media key's value an http(s) or data: URL, an object
   * with one, base64 data or null; a prompt_embeds part with short or long base64.
   */
  const mediaPart: fc.Arbitrary<JsonValue> = fc.oneof(
    fc
      .tuple(
        fc.constantFrom(...MEDIA_KEYS),
        fc.oneof(
          unicode,
          fc.constantFrom('https://example.com/a.jpg', `data:image/png;base64,${'A'.repeat(5000)}`),
          fc.record({ url: unicode, detail: fc.constantFrom('auto', 'low') }),
          fc.record({ data: unicode, format: fc.constant('wav') }),
          fc.constant(null),
        ),
      )
      .map(([key, value]) => ({ type: key, [key]: value })),
    fc.record({
      type: fc.constant('prompt_embeds'),
      data: fc.oneof(unicode, fc.constant('A'.repeat(5000))),
    }),
  );
  /** Messages with members the gateway does not care about, and values of every type. */
  const richMessage = fc.record(
    {
      role: fc.constantFrom('system', 'user', 'assistant', 'tool', 'développeur'),
      content: fc.oneof(
        unicode,
        fc.constant(null),
        fc.array(fc.oneof(fc.record({ type: fc.constant('text'), text: unicode }), mediaPart)),
      ),
      name: unicode,
      tool_call_id: unicode,
      tool_calls: fc.array(
        fc.record({
          id: unicode,
          index: fc.nat(),
          function: fc.record({ name: unicode, arguments: unicode }),
        }),
        { maxLength: 2 },
      ),
      weight: fc.oneof(fc.double({ noNaN: true, noDefaultInfinity: true }), fc.boolean()),
    },
    { requiredKeys: ['role'] },
  );

  it('on messages arrays: ceil(code points of the string values / 4)', () => {
    fc.assert(
      fc.property(fc.array(message, { maxLength: 8 }), style, (messages, s) => {
        check(
          bytes(
            serialize(
              new Members([
                ['model', 'm'],
                ['messages', messages],
              ]),
              s,
            ),
          ),
          'chat',
        );
      }),
      { numRuns: 2000 },
    );
  });

  it('on messages with tool calls, names, nulls, numbers and unicode text', () => {
    fc.assert(
      fc.property(fc.array(richMessage, { maxLength: 6 }), style, (messages, s) => {
        const value = JSON.parse(JSON.stringify(messages)) as JsonValue;
        check(
          bytes(
            serialize(
              new Members([
                ['messages', value],
                ['model', 'm'],
              ]),
              s,
            ),
          ),
          'chat',
        );
      }),
      { numRuns: 2000 },
    );
  });

  it('on messages arrays of any JSON values, keys with unicode and escapes included', () => {
    fc.assert(
      fc.property(
        fc.array(fc.jsonValue({ maxDepth: 4, stringUnit: 'binary' })),
        style,
        (messages, s) => checkField('messages', messages, s),
      ),
      { numRuns: 2000 },
    );
  });

  it('on tools and documents of any JSON values beside messages: every string, keys included', () => {
    const definitions = fc.array(fc.jsonValue({ maxDepth: 4, stringUnit: 'binary' }), {
      maxLength: 4,
    });
    fc.assert(
      fc.property(
        fc.array(message, { maxLength: 3 }),
        definitions,
        definitions,
        fc.constantFrom('tools', 'documents', 'both'),
        style,
        (messages, tools, documents, which, s) => {
          const members: [string, JsonValue][] = [
            ['model', 'm'],
            ['messages', messages],
          ];
          if (which !== 'documents') members.push(['tools', tools]);
          if (which !== 'tools') members.push(['documents', documents]);
          const body = bytes(serialize(new Members(members), s));
          // As checkField: keys the serializer made duplicates say nothing here.
          const parsed = JSON.parse(Buffer.from(body).toString('utf8')) as Record<string, unknown>;
          fc.pre(
            keyCount(parsed['tools']) === keyCount(which === 'documents' ? undefined : tools) &&
              keyCount(parsed['documents']) === keyCount(which === 'tools' ? undefined : documents),
          );
          check(body, 'chat');
        },
      ),
      { numRuns: 2000 },
    );
  });

  it('on completions prompts of every shape: token ids counted exactly', () => {
    const prompt = fc.oneof(
      unicode,
      fc.array(fc.nat(200_000), { maxLength: 50 }),
      fc.array(unicode, { maxLength: 6 }),
      fc.array(fc.array(fc.nat(200_000), { maxLength: 20 }), { maxLength: 6 }),
      fc.jsonValue({ maxDepth: 3, stringUnit: 'grapheme' }),
    );
    fc.assert(
      fc.property(prompt, style, (p, s) => checkField('prompt', p as JsonValue, s)),
      { numRuns: 2000 },
    );
  });

  it('on request-like objects: duplicates, nulls, junk members', () => {
    let ok = 0;
    fc.assert(
      fc.property(requestMembers, style, (members, s) => {
        const body = bytes(serialize(members, s));
        let peeked: PeekedRequest;
        try {
          peeked = peekRequest(body);
        } catch (error) {
          if (error instanceof RequestPeekError) return;
          throw error;
        }
        ok++;
        for (const endpoint of ['chat', 'completion'] as const) {
          expect(estimatePromptTokens(body, peeked, endpoint)).toBe(
            referenceEstimate(body, endpoint),
          );
        }
      }),
      { numRuns: 2000 },
    );
    expect(ok).toBeGreaterThan(500);
  });

  it('on long contents with escapes and multi-byte text at every position', () => {
    const special = fc.constantFrom(
      '\\"',
      '\\\\',
      '\\n',
      '\\u00e9',
      '\\ud83d\\ude00',
      '\\ud83d',
      '\\ude00',
      'é',
      '中',
      '😀',
      ' ',
    );
    const content = fc
      .tuple(
        fc.array(fc.tuple(fc.nat(700), special), { maxLength: 6 }),
        fc.nat(700),
        fc.constantFrom('a', 'ab', 'é', '中', '😀'),
      )
      .map(
        ([runs, tail, filler]) =>
          runs.map(([length, piece]) => filler.repeat(length) + piece).join('') +
          filler.repeat(tail),
      );
    fc.assert(
      fc.property(fc.array(content, { minLength: 1, maxLength: 3 }), (contents) => {
        const messages = contents.map((c) => `{"role":"user","content":"${c}"}`).join(',');
        const body = bytes(`{"model":"m","messages":[${messages}]}`);
        check(body, 'chat');
      }),
      { numRuns: 1000 },
    );
  });
});
