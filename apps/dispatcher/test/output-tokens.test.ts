import { describe, expect, it } from 'vitest';
import { OutputTokens } from '../src/output-tokens.ts';

const event = (content: string) =>
  `data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":${JSON.stringify(content)}}}]}\n\n`;

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
    // Fewer than counted: the charge stays, the end frame says what the engine reported.
    const fewer = new OutputTokens(true);
    fewer.chunk(Buffer.from(event('a') + event('b') + event('c')));
    fewer.chunk(Buffer.from('data: {"choices":[],"usage":{"completion_tokens":2}}\n\n'));
    expect(fewer.end()).toBe(0);
    expect(fewer.totals()).toEqual({ completionTokens: 2 });
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

  it('charges nothing more where the engine reports no usage, or less than counted', () => {
    const plain = new OutputTokens(false);
    plain.chunk(Buffer.from('{"choices":[]}'));
    expect(plain.end()).toBe(0);
    const stream = new OutputTokens(true);
    stream.chunk(Buffer.from(event('a') + event('b') + event('c')));
    stream.chunk(Buffer.from('data: {"choices":[],"usage":{"completion_tokens":2}}\n\n'));
    expect(stream.end()).toBe(0);
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
