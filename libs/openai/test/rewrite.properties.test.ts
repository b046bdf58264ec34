import { Buffer } from 'node:buffer';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { peekRequest, rewriteRequest } from '../src/index.js';
import type { RewritePlan } from '../src/index.js';
import {
  laxBoolString,
  laxIntString,
  Members,
  RawNumber,
  serialize,
  style,
} from './arbitraries.js';
import type { Value } from './arbitraries.js';
import { pydanticInt } from './helpers.js';
import {
  constrainsOutput,
  expectedRewrite,
  expectSpliced,
  GUIDED_KEYS,
  instructionTarget,
  limitOf,
  promptMustStay,
  vllmLimit,
} from './rewrite-helpers.js';

type Entry = readonly [string, Value];
const members = (entries: Entry[]): Members => new Members(entries);

/** Strings with everything JSON must escape, non-ASCII text, emoji and lone surrogates. */
const text = fc.oneof(
  { weight: 3, arbitrary: fc.string({ maxLength: 30 }) },
  fc.string({ unit: 'binary', maxLength: 20 }),
  fc.string({ unit: 'grapheme', maxLength: 10 }),
  fc.constantFrom(
    '',
    'say "hi"\n\tnow',
    'C:\\path\\file',
    'café 中文 😀',
    '\u2028\u2029',
    '\ud800',
    '\udc00x',
    '\u0000\u001f',
    '}],{"role":"system"',
  ),
);
const json = fc.jsonValue({ maxDepth: 3 });
/** A key that is none of the fields Sluice reads (those are generated on purpose). */
const junkKey = fc
  .oneof(fc.string({ maxLength: 12 }), fc.constantFrom('role', 'content', '__proto__', 'type'))
  .filter(
    (k) =>
      ![
        'model',
        'stream',
        'max_tokens',
        'max_completion_tokens',
        'min_tokens',
        'echo',
        'messages',
        'prompt',
        'n', // validated by the peek
        'priority',
        'stream',
        'tools',
        'prompt_logprobs',
        'return_token_ids',
        'return_prompt_text',
        'truncate_prompt_tokens',
        'tool_choice',
        'response_format',
        ...GUIDED_KEYS,
      ].includes(k),
  );

/** Members of a message object in random order, sometimes with duplicates or nested junk. */
const messageObject = (role: fc.Arbitrary<string>) =>
  fc
    .record({
      role,
      content: fc.oneof(
        { weight: 5, arbitrary: text },
        // multimodal content parts: nested objects in the first element, a text part (with or
        // without its type) or another, an empty array
        {
          weight: 2,
          arbitrary: fc.array(
            fc.record(
              { type: fc.constantFrom('text', 'text', 'image_url'), text },
              { requiredKeys: ['text'] },
            ),
            { maxLength: 3 },
          ),
        },
        fc.constant(null),
        // a content the instruction cannot join (vLLM refuses most of these)
        fc.oneof(fc.integer(), fc.dictionary(junkKey, json, { maxKeys: 2 }), fc.constant(false)),
      ),
      extra: fc.array(fc.tuple(junkKey, json), { maxLength: 2 }),
      // an earlier duplicate of role or content that the last one overrides
      shadow: fc.oneof(
        { weight: 4, arbitrary: fc.constant(undefined) },
        { weight: 1, arbitrary: fc.tuple(fc.constantFrom('role', 'content'), json) },
      ),
      order: fc.nat(),
      // now and then a message without a role, or without content
      dropRole: fc.nat(9).map((k) => k === 0),
      dropContent: fc.nat(9).map((k) => k === 0),
    })
    .map(({ role: r, content, extra, shadow, order, dropRole, dropContent }) => {
      const entries: Entry[] = [...extra];
      if (!dropContent) entries.splice(order % (entries.length + 1), 0, ['content', content]);
      if (!dropRole) entries.splice((order >> 3) % (entries.length + 1), 0, ['role', r]);
      if (shadow !== undefined) entries.unshift(shadow);
      return members(entries) as Value;
    });

const messages = fc
  .record({
    systemFirst: fc.boolean(),
    first: messageObject(
      fc.constantFrom('system', 'system', 'user', 'developer', 'System', 'assistant'),
    ),
    rest: fc.array(messageObject(fc.constantFrom('user', 'assistant', 'system', 'tool')), {
      maxLength: 4,
    }),
    // now and then a first element that is not an object
    odd: fc.oneof(
      { weight: 8, arbitrary: fc.constant(undefined) },
      { weight: 1, arbitrary: fc.oneof(json, fc.constant('system')) },
    ),
  })
  .map(({ systemFirst, first, rest, odd }) => {
    const list: Value[] = systemFirst ? [first, ...rest] : rest;
    if (odd !== undefined) list.unshift(odd as Value); // a first element that is not an object
    return list as Value;
  });

/** Strings and booleans vLLM's lax pydantic reads as the integers they spell. */
const laxLimit = fc.oneof(
  {
    weight: 4,
    arbitrary: laxIntString.filter((v) => {
      const n = pydanticInt(v);
      return n !== 'bad' && n !== undefined && Number.isSafeInteger(n) && n >= 0;
    }),
  },
  fc.boolean().map((v) => v as Value),
);

const limit = fc.oneof(
  { weight: 6, arbitrary: fc.nat(100_000).map((v) => v as Value) },
  fc.constant(null),
  fc.constantFrom('1e2', '100.0', '1E+3', '-0', '0', '5').map((t) => new RawNumber(t) as Value),
  laxLimit,
);

/** min_tokens: mostly small against the limits above, so the floor often binds. */
const minTokens = fc.oneof(
  { weight: 4, arbitrary: fc.nat(2_000).map((v) => v as Value) },
  fc.nat(100_000).map((v) => v as Value),
  fc.constant(null),
  fc.constantFrom('5e2', '100.0', '-0').map((t) => new RawNumber(t) as Value),
  laxLimit,
);

/** tool_choice: free ("auto", "none", null) or forcing a tool call ("required", a named tool). */
const toolChoice = fc.oneof(
  fc.constantFrom('auto', 'none', 'required', null).map((v) => v as Value),
  fc.record({ type: fc.constant('function'), function: fc.record({ name: text }) }),
  json,
);

/** response_format: text, or JSON of some kind, or anything. */
const responseFormat = fc.oneof(
  { weight: 2, arbitrary: fc.constant({ type: 'text' } as Value) },
  fc.constantFrom('json_object', 'json_schema', 'structural_tag').map((type) => ({ type })),
  fc.constant(null),
  json,
  // the type hidden behind duplicates: the last one counts
  fc.tuple(fc.constantFrom('text', 'json_object'), fc.constantFrom('text', 'json_object')).map(
    ([a, b]) =>
      members([
        ['type', a],
        ['x', 1],
        ['type', b],
      ]) as Value,
  ),
);

/** vLLM's guided decoding: one of its keys, with a value or null (as if absent). */
const guided = fc.tuple(
  fc.constantFrom(...GUIDED_KEYS),
  fc.oneof(
    fc.constant(null),
    json,
    text.map((t) => t as Value),
  ),
);

/** A value one time in twenty, else undefined (no such member). */
const rarely = <T>(arbitrary: fc.Arbitrary<T>): fc.Arbitrary<T | undefined> =>
  fc.oneof({ weight: 19, arbitrary: fc.constant(undefined) }, { weight: 1, arbitrary });

/** A value one time in four, else undefined (no such member). */
const sometimes = <T>(arbitrary: fc.Arbitrary<T>): fc.Arbitrary<T | undefined> =>
  fc.oneof({ weight: 3, arbitrary: fc.constant(undefined) }, { weight: 1, arbitrary });

/**
 * echo, return_token_ids, return_prompt_text: a boolean, null, or another value vLLM's lax
 * bool reads (as true or false) or refuses.
 */
const flag = fc.oneof(
  { weight: 4, arbitrary: fc.boolean().map((v) => v as Value) },
  fc.constant(null),
  fc.constantFrom(1, 0, 'yes', 'false', 'Off', 2, 'maybe').map((v) => v as Value),
  laxBoolString,
);

/** prompt_logprobs, truncate_prompt_tokens: on with any value but null (0 and -1 included). */
const promptCount = fc.oneof(
  fc.constant(null),
  fc.constantFrom(0, 1, 5, -1).map((v) => v as Value),
);

/** tools: a non-empty list (which constrains chat unless tool_choice is "none"), empty, null. */
const tools = fc.oneof(
  {
    weight: 3,
    arbitrary: fc
      .array(fc.record({ type: fc.constant('function'), function: fc.record({ name: text }) }), {
        minLength: 1,
        maxLength: 2,
      })
      .map((t) => t as Value),
  },
  fc.constant([] as Value),
  fc.constant(null),
);

const prompt = fc.oneof(
  text.map((t) => t as Value),
  fc.tuple(text).map((t) => t as Value),
  fc.array(text, { minLength: 2, maxLength: 3 }).map((t) => t as Value),
  fc.array(fc.nat(50_000), { maxLength: 5 }).map((t) => t as Value),
  fc.array(fc.array(fc.nat(50_000), { maxLength: 3 }), { maxLength: 2 }).map((t) => t as Value),
  fc.constant(null),
);

/** A valid request: model first or not, optional fields in random order, junk, duplicates. */
const request = fc
  .record({
    model: text,
    messages: fc.option(fc.oneof({ weight: 8, arbitrary: messages }, fc.constant(null)), {
      freq: 6,
      nil: undefined,
    }),
    prompt: fc.option(prompt, { freq: 3, nil: undefined }),
    maxTokens: fc.option(limit, { nil: undefined }),
    maxCompletionTokens: fc.option(limit, { nil: undefined }),
    minTokens: fc.option(minTokens, { nil: undefined }),
    echo: sometimes(flag),
    returnTokenIds: rarely(flag),
    returnPromptText: rarely(flag),
    promptLogprobs: rarely(promptCount),
    truncatePromptTokens: rarely(promptCount),
    tools: sometimes(tools),
    stream: fc.option(fc.oneof(fc.boolean(), fc.constant(null)), { nil: undefined }),
    toolChoice: sometimes(toolChoice),
    responseFormat: sometimes(responseFormat),
    guided: sometimes(guided),
    junk: fc.array(fc.tuple(junkKey, json), { maxLength: 3 }),
    shadows: fc.array(
      fc.tuple(
        fc.constantFrom(
          'max_tokens',
          'messages',
          'prompt',
          'max_completion_tokens',
          'min_tokens',
          'echo',
          'tool_choice',
          'response_format',
          'guided_json',
          'tools',
          'prompt_logprobs',
          'return_token_ids',
        ),
        json,
      ),
      { maxLength: 2 },
    ),
    order: fc.array(fc.nat(), { minLength: 16, maxLength: 16 }),
  })
  .map((r) => {
    const entries: Entry[] = [...r.junk];
    const add = (k: number, key: string, v: Value | undefined) => {
      if (v !== undefined) entries.splice(r.order[k]! % (entries.length + 1), 0, [key, v]);
    };
    add(0, 'model', r.model);
    add(1, 'messages', r.messages);
    add(2, 'prompt', r.prompt);
    add(3, 'max_tokens', r.maxTokens);
    add(4, 'max_completion_tokens', r.maxCompletionTokens);
    add(5, 'stream', r.stream);
    add(6, 'min_tokens', r.minTokens);
    add(7, 'echo', r.echo);
    add(8, 'tool_choice', r.toolChoice);
    add(9, 'response_format', r.responseFormat);
    if (r.guided !== undefined) add(10, r.guided[0], r.guided[1]);
    add(11, 'return_token_ids', r.returnTokenIds);
    add(12, 'return_prompt_text', r.returnPromptText);
    add(13, 'prompt_logprobs', r.promptLogprobs);
    add(14, 'truncate_prompt_tokens', r.truncatePromptTokens);
    add(15, 'tools', r.tools);
    // Duplicates of a field come before its last occurrence, so the last one counts.
    for (const [key, v] of r.shadows) {
      const last = entries.findIndex(([k]) => k === key);
      if (last >= 0) entries.splice(last, 0, [key, v]);
    }
    return members(entries);
  });

const plan: fc.Arbitrary<RewritePlan> = fc.record({
  endpoint: fc.constantFrom('chat', 'completion'),
  instruction: fc.option(text, { freq: 5, nil: undefined }),
  systemPrompt: fc.constantFrom('prepend', 'append'),
  completionPrefix: fc.boolean(),
  maxTokensFactor: fc.oneof(
    fc.constant(1),
    fc.constantFrom(0, 0.3, 0.5, 0.7, 1.5),
    fc.double({ min: 0, max: 2, noNaN: true }),
  ),
  minMaxTokens: fc.integer({ min: 1, max: 300 }),
  // no longer read: given or not, it changes nothing
  defaultMaxTokens: fc.option(fc.integer({ min: 1, max: 8192 }), { nil: undefined }),
});

function check(body: Buffer, p: RewritePlan): Buffer {
  const peeked = peekRequest(body);
  const out = rewriteRequest(body, peeked, p);
  const expected = expectedRewrite(body, peeked, p);
  expect(JSON.parse(out.toString('utf8'))).toStrictEqual(expected.value);
  expectSpliced(body, out, expected.edits);
  if (expected.edits.length === 0) expect(out).toBe(body);
  // What comes out is a request the peek (and so the gateway) accepts again.
  const again = peekRequest(out);
  expect(again.model).toBe(peeked.model);
  expect(again.stream).toBe(peeked.stream);
  return out;
}

describe('rewriteRequest agrees with JSON.parse + object edits', () => {
  it('on random request bodies and plans: value, and untouched bytes', () => {
    let changed = 0;
    let promptKept = 0;
    let toolsKeepLimits = 0;
    let laxLimits = 0;
    const into = { system: 0, user: 0 };
    fc.assert(
      fc.property(request, style, plan, (req, s, p) => {
        const body = Buffer.from(serialize(req, s), 'utf8');
        const out = check(body, p);
        if (out !== body) changed++;
        const v = JSON.parse(body.toString()) as Record<string, unknown> & { messages?: unknown };
        if (p.instruction && promptMustStay(v, p.endpoint)) promptKept++;
        if (p.endpoint === 'chat' && Array.isArray(v.tools) && v.tools.length > 0) {
          if (constrainsOutput(v, 'chat') && !constrainsOutput({ ...v, tools: null }, 'chat')) {
            toolsKeepLimits++;
          }
        }
        if (typeof v.max_tokens === 'string' || typeof v.max_tokens === 'boolean') laxLimits++;
        if (p.endpoint === 'chat' && p.instruction && Array.isArray(v.messages)) {
          const target = instructionTarget(v.messages, p.systemPrompt);
          if (target !== undefined && out.length > body.length)
            into[target.message.role === 'system' ? 'system' : 'user']++;
        }
      }),
      { numRuns: 3000 },
    );
    // The generator must reach the interesting paths, or the checks prove little.
    // (about a third of the bodies now keep their prompt or their limits on purpose)
    expect(changed).toBeGreaterThan(800);
    expect(into.system).toBeGreaterThan(30);
    expect(into.user).toBeGreaterThan(30);
    expect(promptKept).toBeGreaterThan(150);
    expect(toolsKeepLimits).toBeGreaterThan(50);
    expect(laxLimits).toBeGreaterThan(100);
  });

  it('never adds, drops or reorders a message: every role stays as the client sent it', () => {
    // Chat templates that refuse a system role (Gemma's "System role not supported") or a
    // second one (vLLM's tool_chat_template_mistral3.jinja) see the roles they were sent.
    fc.assert(
      fc.property(request, style, plan, (req, s, p) => {
        const body = Buffer.from(serialize(req, s), 'utf8');
        const out = rewriteRequest(body, peekRequest(body), { ...p, endpoint: 'chat' });
        const roles = (raw: Buffer) => {
          const { messages } = JSON.parse(raw.toString('utf8')) as { messages?: unknown };
          return Array.isArray(messages)
            ? messages.map((m: unknown) =>
                m !== null && typeof m === 'object' ? (m as { role?: unknown }).role : typeof m,
              )
            : messages;
        };
        expect(roles(out)).toStrictEqual(roles(body));
      }),
      { numRuns: 1000 },
    );
  });

  it('never raises or adds the limit vLLM applies, nor lowers it below min_tokens', () => {
    let floored = 0;
    let completionDefault = 0;
    let constrained = 0;
    let scaled = 0;
    fc.assert(
      fc.property(request, style, plan, (req, s, p) => {
        const body = Buffer.from(serialize(req, s), 'utf8');
        const out = rewriteRequest(body, peekRequest(body), p);
        const before = JSON.parse(body.toString('utf8')) as Record<string, unknown>;
        const after = JSON.parse(out.toString('utf8')) as Record<string, unknown>;
        const was = vllmLimit(before, p.endpoint);
        const now = vllmLimit(after, p.endpoint);
        expect(now).toBeLessThanOrEqual(was);
        // vLLM refuses prompt + max_tokens > max_model_len, which is not known here: a request
        // left to the end of the context window is never given a limit.
        if (was === Infinity) expect(now).toBe(Infinity);
        // A grammar-constrained answer cut short is invalid: such requests keep every limit.
        if (constrainsOutput(before, p.endpoint)) {
          constrained++;
          for (const key of ['max_tokens', 'max_completion_tokens'])
            expect(after[key]).toStrictEqual(before[key]);
        } else if (now < was) {
          scaled++;
        }
        const minTokens = limitOf(before, 'min_tokens') ?? 0;
        if (minTokens <= was) {
          // A request vLLM accepts stays one it accepts: SamplingParams refuses min > max.
          expect(now).toBeGreaterThanOrEqual(minTokens);
        } else {
          // vLLM refuses it as the client sent it; the rewrite does not make that worse.
          expect(now).toBe(was);
        }
        if (minTokens > 0 && now === minTokens && now < was) floored++;
        if (p.endpoint === 'completion' && !Object.hasOwn(before, 'max_tokens')) {
          completionDefault++;
        }
      }),
      { numRuns: 3000 },
    );
    // The generator must reach the floor and the completions default, or this proves little.
    expect(floored).toBeGreaterThan(30);
    expect(completionDefault).toBeGreaterThan(100);
    expect(constrained).toBeGreaterThan(300);
    expect(scaled).toBeGreaterThan(300);
  });

  it('whatever the alignment of the bytes in their buffer (long strings, word scanning)', () => {
    const long = fc.string({ minLength: 200, maxLength: 600 });
    fc.assert(
      fc.property(
        long,
        long,
        fc.nat(7),
        fc.constantFrom('append', 'prepend'),
        text,
        (system, prompt, pad, mode, instruction) => {
          const source = JSON.stringify({
            model: 'm',
            messages: [
              { role: 'system', content: system },
              { role: 'user', content: prompt },
            ],
            prompt: [prompt],
          });
          const raw = Buffer.from(source);
          const backing = Buffer.alloc(raw.length + pad + 3, 0x22);
          raw.copy(backing, pad);
          const body = backing.subarray(pad, pad + raw.length);
          for (const endpoint of ['chat', 'completion'] as const) {
            check(body, {
              endpoint,
              instruction,
              systemPrompt: mode,
              completionPrefix: true,
              maxTokensFactor: 0.5,
              minMaxTokens: 1,
              defaultMaxTokens: 100,
            });
          }
        },
      ),
      { numRuns: 300 },
    );
  });
});
