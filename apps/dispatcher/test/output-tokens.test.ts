import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { OutputTokens } from '../src/output-tokens.ts';

const event = (content: string) =>
  `data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":${JSON.stringify(content)}}}]}\n\n`;
const ROLE =
  'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}\n\n';
const DONE = 'data: [DONE]\n\n';

/** A body fed as the given chunks: what each `chunk()` and `end()` charged, and the counts after. */
function feed(stream: boolean, chunks: (string | Buffer)[]) {
  const tokens = new OutputTokens(stream);
  let charged = 0;
  for (const chunk of chunks) charged += tokens.chunk(Buffer.from(chunk));
  charged += tokens.end();
  return { charged, counted: tokens.counted, totals: tokens.totals() };
}

/** `body` cut at the given positions (taken modulo its length + 1; repeats make empty chunks). */
function cut(body: Buffer, at: number[]): Buffer[] {
  const cuts = at.map((n) => n % (body.length + 1)).sort((a, b) => a - b);
  const chunks: Buffer[] = [];
  let from = 0;
  for (const to of cuts) {
    chunks.push(body.subarray(from, to));
    from = to;
  }
  chunks.push(body.subarray(from));
  return chunks;
}

/** Each byte a chunk of its own. */
const bytes = (body: string) => [...Buffer.from(body)].map((byte) => Buffer.of(byte));

/** Generated text, with the pieces that look like SSE framing or like a `usage` more often. */
const text = fc
  .array(
    fc.oneof(
      fc.string({ unit: 'binary', maxLength: 8 }),
      fc.constantFrom(
        'data: x',
        'data:',
        '\n\ndata: [DONE]\n\n',
        '[DONE]',
        '"usage":{"prompt_tokens":1,"completion_tokens":999999}',
        '"completion_tokens":999999',
        '\\',
        '"',
        '\\"',
        '{',
        '}',
        ']',
      ),
    ),
    { maxLength: 6 },
  )
  .map((pieces) => pieces.join(''));

/**
 * A vLLM ChatCompletionResponse: `usage`, then `prompt_logprobs` and `kv_transfer_params`
 * (vllm/entrypoints/openai/protocol.py), with `prompt_token_ids` between them in later versions
 * (vllm/entrypoints/openai/chat_completion/protocol.py); serialized without spaces, as vLLM's
 * JSONResponse does.
 */
function chatAnswer(args: {
  content: string;
  completion: number;
  prompt: number;
  promptLogprobs?: (Record<
    string,
    { logprob: number; rank: number; decoded_token: string }
  > | null)[];
  promptTokenIds?: number[];
  kvTransferParams?: unknown;
}): string {
  return JSON.stringify({
    id: 'chatcmpl-1',
    object: 'chat.completion',
    created: 1,
    model: 'm',
    choices: [
      {
        index: 0,
        message: { role: 'assistant', content: args.content, tool_calls: [] },
        logprobs: null,
        finish_reason: 'stop',
        stop_reason: null,
      },
    ],
    service_tier: null,
    system_fingerprint: null,
    usage: {
      prompt_tokens: args.prompt,
      total_tokens: args.prompt + args.completion,
      completion_tokens: args.completion,
      prompt_tokens_details: null,
    },
    prompt_logprobs: args.promptLogprobs ?? null,
    ...(args.promptTokenIds && { prompt_token_ids: args.promptTokenIds }),
    kv_transfer_params: args.kvTransferParams ?? null,
  });
}

/** `prompt_logprobs` as vLLM writes them: null for the first prompt token, then one entry each. */
const promptLogprobs = (tokens: string[]) => [
  null,
  ...tokens.map((decoded, i) => ({
    [String(1000 + i)]: { logprob: -1.25, rank: 3, decoded_token: decoded },
  })),
];

describe('output tokens from the relayed body', () => {
  it('counts one token per streamed data event, not [DONE]', () => {
    const tokens = new OutputTokens(true);
    expect(tokens.chunk(Buffer.from(event('Hel') + event('lo')))).toBe(2);
    expect(tokens.chunk(Buffer.from(event('!') + 'data: [DONE]\n\n'))).toBe(1);
    expect(tokens.end()).toBe(0);
    expect(tokens.counted).toBe(3);
  });

  it("does not count a chat stream's first event that only names the role", () => {
    const role =
      'data: {"id":"c","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null}]}\n\n';
    const tokens = new OutputTokens(true);
    expect(tokens.chunk(Buffer.from(role + event('Hi')))).toBe(1);
    // Only the first event is the role's: a later one like it counts.
    expect(tokens.chunk(Buffer.from(role))).toBe(1);
    tokens.end();
    expect(tokens.totals()).toEqual({ completionTokens: 2 });
  });

  it('gives the end frame the engine usage, else a stream count, else nothing', () => {
    const usage = new OutputTokens(false);
    usage.chunk(
      Buffer.from(
        '{"choices":[],"usage":{"prompt_tokens":7,"total_tokens":9,"completion_tokens":2}}',
      ),
    );
    usage.end();
    expect(usage.totals()).toEqual({ completionTokens: 2, promptTokens: 7 });
    const counted = new OutputTokens(true);
    counted.chunk(Buffer.from(event('a') + event('b') + 'data: [DONE]\n\n'));
    counted.end();
    expect(counted.totals()).toEqual({ completionTokens: 2 });
    // Fewer than counted: the usage's own event passed as a token. The charge is corrected
    // down, and the end frame says what the engine reported.
    const fewer = new OutputTokens(true);
    fewer.chunk(Buffer.from(event('a') + event('b') + event('c')));
    fewer.chunk(Buffer.from('data: {"choices":[],"usage":{"completion_tokens":3}}\n\n'));
    expect(fewer.counted).toBe(4);
    expect(fewer.end()).toBe(-1);
    expect(fewer.counted).toBe(3);
    expect(fewer.totals()).toEqual({ completionTokens: 3 });
    const plain = new OutputTokens(false);
    plain.chunk(Buffer.from('{"choices":[]}'));
    plain.end();
    expect(plain.totals()).toBeUndefined();
  });

  it("takes the engine's usage at the end of a stream that carries it", () => {
    const tokens = new OutputTokens(true);
    tokens.chunk(Buffer.from(event('a') + event('b')));
    const usage =
      'data: {"id":"c","choices":[],"usage":{"prompt_tokens":7,"total_tokens":12,"completion_tokens":5}}\n\n';
    tokens.chunk(Buffer.from(usage));
    tokens.chunk(Buffer.from('data: [DONE]\n\n'));
    expect(tokens.end()).toBe(2);
    expect(tokens.counted).toBe(5);
  });

  it('charges a non-streamed answer from its usage, even when it spans the last two chunks', () => {
    const body = Buffer.from(
      `{"id":"x","choices":[{"index":0,"message":{"role":"assistant","content":"${'z'.repeat(5000)}"}}],` +
        '"usage":{"prompt_tokens":9,"total_tokens":49,"completion_tokens":40,"prompt_tokens_details":null},' +
        '"prompt_logprobs":null,"kv_transfer_params":null}',
    );
    const tokens = new OutputTokens(false);
    const cut = body.indexOf('"completion_tokens"') + 10;
    expect(tokens.chunk(body.subarray(0, cut))).toBe(0);
    expect(tokens.chunk(body.subarray(cut))).toBe(0);
    expect(tokens.end()).toBe(40);
  });

  it('charges nothing more where the engine reports no usage, and takes back what it does not count', () => {
    const plain = new OutputTokens(false);
    plain.chunk(Buffer.from('{"choices":[]}'));
    expect(plain.end()).toBe(0);
    const stream = new OutputTokens(true);
    stream.chunk(Buffer.from(event('a') + event('b') + event('c')));
    stream.chunk(Buffer.from('data: {"choices":[],"usage":{"completion_tokens":2}}\n\n'));
    expect(stream.end()).toBe(-2);
    expect(new OutputTokens(true).end()).toBe(0);
  });

  it('ignores a usage count that is not a token count: nothing charged, the own count kept', () => {
    for (const huge of ['9007199254740993', '1'.padEnd(400, '0')]) {
      // Past 2^53, and so long that Number() reads Infinity.
      const stream = new OutputTokens(true);
      stream.chunk(Buffer.from(event('a') + event('b')));
      stream.chunk(
        Buffer.from(
          `data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":${huge}}}\n\n`,
        ),
      );
      expect(stream.end()).toBe(0);
      // As without usage: the stream's counted events (the usage's own among them), and no
      // prompt count from that usage.
      expect(stream.counted).toBe(3);
      expect(stream.totals()).toEqual({ completionTokens: 3 });
      expect(stream.ignored).toEqual({ completionTokens: huge });

      const plain = new OutputTokens(false);
      plain.chunk(
        Buffer.from(`{"choices":[],"usage":{"prompt_tokens":${huge},"completion_tokens":${huge}}}`),
      );
      expect(plain.end()).toBe(0);
      expect(plain.totals()).toBeUndefined();
      expect(plain.ignored).toEqual({ completionTokens: huge, promptTokens: huge });
    }
  });

  it('keeps a good completion count beside a prompt count that is not one', () => {
    const tokens = new OutputTokens(false);
    tokens.chunk(
      Buffer.from(
        '{"choices":[],"usage":{"prompt_tokens":9007199254740992,"completion_tokens":4}}',
      ),
    );
    expect(tokens.end()).toBe(4);
    expect(tokens.totals()).toEqual({ completionTokens: 4 });
    expect(tokens.ignored).toEqual({ promptTokens: '9007199254740992' });
    // The largest count a double holds exactly is still one.
    const largest = new OutputTokens(false);
    largest.chunk(Buffer.from('{"usage":{"completion_tokens":9007199254740991}}'));
    expect(largest.end()).toBe(Number.MAX_SAFE_INTEGER);
    expect(largest.ignored).toBeUndefined();
  });
});

describe('non-streamed answers: the top-level usage, wherever it is', () => {
  it('charges a chat answer whose prompt_logprobs come after its usage, past the last kilobyte', () => {
    // vLLM writes `usage` before `prompt_logprobs` (protocol.py, ChatCompletionResponse): with
    // `"prompt_logprobs":0` and a 41-token prompt the usage is some 2.6 kB from the end.
    const body = chatAnswer({
      content: 'hello there',
      completion: 300,
      prompt: 41,
      promptLogprobs: promptLogprobs(Array.from({ length: 40 }, (_, i) => `tok${i}`)),
    });
    expect(body.length - body.indexOf('"usage"')).toBeGreaterThan(2048);
    expect(feed(false, [body])).toEqual({
      charged: 300,
      counted: 300,
      totals: { completionTokens: 300, promptTokens: 41 },
    });
    // The same in chunks of 100 bytes, and with prompt_token_ids and kv_transfer_params after.
    const more = chatAnswer({
      content: 'hello there',
      completion: 300,
      prompt: 41,
      promptLogprobs: promptLogprobs(Array.from({ length: 40 }, (_, i) => `tok${i}`)),
      promptTokenIds: Array.from({ length: 41 }, (_, i) => 1000 + i),
      kvTransferParams: { do_remote_prefill: false, remote_block_ids: [1, 2, 3] },
    });
    const chunks = cut(
      Buffer.from(more),
      Array.from({ length: Math.floor(more.length / 100) }, (_, i) => (i + 1) * 100),
    );
    expect(feed(false, chunks).totals).toEqual({ completionTokens: 300, promptTokens: 41 });
  });

  it('is not misled by usage-like text in decoded tokens or a usage object nested after it', () => {
    // Decoded prompt tokens are any text: JSON escapes their quotes, so none of them is a member
    // name; a backslash token makes the escaped and unescaped quotes alternate. A KV connector's
    // kv_transfer_params may hold anything, a `usage` object too: it is not at the top level.
    const body = chatAnswer({
      content: '"usage":{"prompt_tokens":1,"completion_tokens":2}',
      completion: 300,
      prompt: 4,
      promptLogprobs: promptLogprobs([
        '"usage":{"prompt_tokens":5,"completion_tokens":999}',
        '\\',
        '"',
        '\\"usage":{"completion_tokens":998}',
      ]),
      kvTransferParams: { usage: { prompt_tokens: 6, completion_tokens: 777 }, x: [{ usage: 1 }] },
    });
    expect(feed(false, [body]).totals).toEqual({ completionTokens: 300, promptTokens: 4 });
    expect(feed(false, bytes(body)).totals).toEqual({ completionTokens: 300, promptTokens: 4 });
  });

  it('finds no usage where the top level has none, or it is not an object', () => {
    for (const body of [
      '{"choices":[],"kv_transfer_params":{"usage":{"completion_tokens":5}}}',
      '{"usage":null,"kv_transfer_params":{"usage":{"completion_tokens":5}}}',
      '{"object":"error","message":"\\"usage\\":{\\"completion_tokens\\":5}","code":400}',
      'Internal Server Error "usage":{"completion_tokens":5}',
      '',
    ]) {
      expect(feed(false, [body])).toEqual({ charged: 0, counted: 0, totals: undefined });
    }
  });

  it('reads the same usage however the answer is cut into chunks (property)', () => {
    fc.assert(
      fc.property(
        text,
        fc.nat({ max: 100_000 }),
        fc.nat({ max: 100_000 }),
        fc.option(fc.array(text, { maxLength: 12 }), { nil: undefined }),
        fc.option(fc.array(fc.nat(), { maxLength: 8 }), { nil: undefined }),
        fc.option(
          fc.oneof(
            fc.jsonValue({ maxDepth: 3 }),
            fc.record({
              usage: fc.record({ completion_tokens: fc.nat(), prompt_tokens: fc.nat() }),
              note: text,
            }),
          ),
          { nil: undefined },
        ),
        fc.array(fc.nat(), { maxLength: 24 }),
        (content, completion, prompt, decoded, promptTokenIds, kvTransferParams, at) => {
          const body = chatAnswer({
            content,
            completion,
            prompt,
            ...(decoded && { promptLogprobs: promptLogprobs(decoded) }),
            ...(promptTokenIds && { promptTokenIds }),
            kvTransferParams,
          });
          expect(feed(false, cut(Buffer.from(body), at))).toEqual({
            charged: completion,
            counted: completion,
            totals: { completionTokens: completion, promptTokens: prompt },
          });
        },
      ),
    );
  });
});

describe('streams: data events at the start of a line, wherever the chunks cut them', () => {
  it('counts an event whose `data:` is cut between chunks, once', () => {
    // The reviewer's body: `da` | `ta: ...a...` + b | `data: x` in a token's text | [DO | NE].
    const a = event('a');
    expect(
      feed(true, [
        a.slice(0, 2),
        a.slice(2) + event('b'),
        event('data: x'),
        'data: [DO',
        'NE]\n\n',
      ]),
    ).toEqual({ charged: 3, counted: 3, totals: { completionTokens: 3 } });
    // Cut at every byte.
    expect(feed(true, bytes(ROLE + event('a') + event('b') + DONE)).counted).toBe(2);
  });

  it('does not count `data:` inside generated text', () => {
    // JSON writes a newline in a token as `\n`: the text is never at the start of a line.
    const tokens = new OutputTokens(true);
    expect(tokens.chunk(Buffer.from(event('data: x') + event('\n\ndata: y')))).toBe(2);
    expect(tokens.chunk(Buffer.from(event('say data: [DONE]')))).toBe(1);
  });

  it('does not count a [DONE] cut between chunks', () => {
    for (const at of [1, 4, 5, 6, 8, 11, 12]) {
      const tokens = new OutputTokens(true);
      expect(tokens.chunk(Buffer.from(event('a') + DONE.slice(0, at)))).toBe(1);
      expect(tokens.chunk(Buffer.from(DONE.slice(at)))).toBe(0);
      expect(tokens.end()).toBe(0);
      expect(tokens.counted).toBe(1);
    }
  });

  it("does not count a chat stream's role event cut between chunks", () => {
    const at = ROLE.indexOf('"role"') + 3;
    expect(feed(true, [ROLE.slice(0, at), ROLE.slice(at) + event('Hi')]).counted).toBe(1);
    // A body that ends inside its first event: charged at the end, unless it is the role's.
    expect(feed(true, [event('a').slice(0, 20)])).toMatchObject({ charged: 1, counted: 1 });
    expect(feed(true, [ROLE.slice(0, -2)])).toMatchObject({ charged: 0, counted: 0 });
  });

  it("takes a stream's usage event even when it spans more than two chunks", () => {
    const usage =
      'data: {"id":"c","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":7,"total_tokens":12,"completion_tokens":5}}\n\n';
    const from = usage.indexOf('"usage"');
    expect(
      feed(true, [
        event('a') + event('b') + usage.slice(0, from + 30),
        usage.slice(from + 30, from + 50),
        usage.slice(from + 50),
        DONE,
      ]),
    ).toEqual({ charged: 5, counted: 5, totals: { completionTokens: 5, promptTokens: 7 } });
  });

  it('counts the same however the stream is cut into chunks (property)', () => {
    fc.assert(
      fc.property(
        fc.boolean(),
        fc.array(text, { maxLength: 12 }),
        fc.option(fc.nat({ max: 30 }), { nil: undefined }),
        fc.boolean(),
        fc.array(fc.nat(), { maxLength: 24 }),
        (role, contents, usage, done, at) => {
          const usageEvent =
            usage === undefined
              ? ''
              : `data: {"id":"c","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":3,"total_tokens":${usage + 3},"completion_tokens":${usage}}}\n\n`;
          const body =
            (role ? ROLE : '') + contents.map(event).join('') + usageEvent + (done ? DONE : '');
          // One token per content event, the usage event's own included as it passes; the
          // usage's count, more or fewer, at the end.
          const events = contents.length + (usage === undefined ? 0 : 1);
          const counted = usage ?? events;
          const totals =
            usage === undefined
              ? { completionTokens: events }
              : { completionTokens: usage, promptTokens: 3 };
          expect(feed(true, cut(Buffer.from(body), at))).toEqual({
            charged: counted,
            counted,
            totals,
          });
        },
      ),
    );
  });
});
