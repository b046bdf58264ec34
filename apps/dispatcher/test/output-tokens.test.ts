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
});
