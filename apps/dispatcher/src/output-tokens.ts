// Output tokens of one engine response, counted from the bytes the dispatcher relays anyway,
// for the fair share's charge as they stream, the tenant token counters, and the counts the
// end frame carries to the gateway (its token counters and access log).
//
// A stream is charged one token per SSE `data:` event as it passes: vLLM's streaming loop
// yields one chunk per engine step and request (vllm/entrypoints/openai/serving_chat.py,
// `chat_completion_stream_generator`), and a step adds one token unless speculative decoding
// adds more. At the end, the engine's own `usage.completion_tokens` (every non-streamed answer;
// a stream whose client asked for `stream_options.include_usage`) replaces the count: it
// sits in the response's last bytes (`usage` comes after `choices` in vLLM's response models,
// vllm/entrypoints/openai/protocol.py), so only those are searched, never the whole body.
// A chat stream's first event only names the role (`"delta":{"role":"assistant","content":""}`):
// it is not counted, which only the first event with data is checked for.
// A `usage` count that is not a token count (past 2^53, or so long it reads as Infinity) is
// ignored as if the engine had sent no usage: the gateway would refuse the end frame carrying
// it, and a tenant's fair-share counter charged with it would never come back down.
import { isTokenCount, type EndInfo } from '@sluice/protocol';

const DATA = Buffer.from('data:');
const DONE = Buffer.from('[DONE]');
const ROLE_ONLY = Buffer.from('"delta":{"role":"assistant","content":""}');
/** The last bytes searched for `usage`: it and the few fields after it fit with room to spare. */
const TAIL_BYTES = 1024;
const USAGE = /"completion_tokens"\s*:\s*(\d+)/g;
const PROMPT_USAGE = /"prompt_tokens"\s*:\s*(\d+)/g;

export class OutputTokens {
  /** Tokens counted (and charged) so far. */
  counted = 0;
  /** What the engine's `usage` reported, read by `end()`; undefined when it sent none. */
  reported: EndInfo | undefined;
  /** The `usage` counts `end()` ignored because they are not token counts, as the engine wrote them. */
  ignored: { completionTokens?: string; promptTokens?: string } | undefined;
  private last: Buffer | undefined;
  private beforeLast: Buffer | undefined;
  private firstEvent = true;

  constructor(private readonly stream: boolean) {}

  /** Tokens this chunk of the body adds: its `data:` events for a stream, none otherwise. */
  chunk(chunk: Buffer): number {
    this.beforeLast = this.last;
    this.last = chunk;
    if (!this.stream) return 0;
    let n = 0;
    const first = chunk.indexOf(DATA);
    for (let at = first; at !== -1; at = chunk.indexOf(DATA, at + DATA.length)) n += 1;
    if (n > 0 && chunk.includes(DONE)) n -= 1;
    if (n > 0 && this.firstEvent) {
      this.firstEvent = false;
      const next = chunk.indexOf(DATA, first + DATA.length);
      const event = chunk.subarray(first, next === -1 ? chunk.length : next);
      if (event.includes(ROLE_ONLY)) n -= 1;
    }
    this.counted += n;
    return n;
  }

  /**
   * At the end of the body: the tokens the engine's `usage` reports beyond those counted, or
   * 0 when it reports none (or fewer: a charge is never taken back).
   */
  end(): number {
    if (this.last === undefined) return 0;
    const tail =
      this.beforeLast !== undefined && this.last.length < TAIL_BYTES
        ? Buffer.concat([this.beforeLast, this.last])
        : this.last;
    const text = tail.subarray(Math.max(0, tail.length - TAIL_BYTES)).toString('latin1');
    const completion = lastMatch(text, USAGE);
    if (completion === undefined) return 0;
    const prompt = lastMatch(text, PROMPT_USAGE);
    const reported = Number(completion);
    const promptTokens = prompt === undefined ? undefined : Number(prompt);
    if (!isTokenCount(reported)) {
      // The usage as a whole is not trusted: its prompt count is not used either.
      this.ignored = { completionTokens: completion };
      if (prompt !== undefined && !isTokenCount(promptTokens)) this.ignored.promptTokens = prompt;
      return 0;
    }
    this.reported = { completionTokens: reported };
    if (isTokenCount(promptTokens)) this.reported.promptTokens = promptTokens;
    else if (prompt !== undefined) this.ignored = { promptTokens: prompt };
    if (reported <= this.counted) return 0;
    const more = reported - this.counted;
    this.counted = reported;
    return more;
  }

  /**
   * The counts for the end frame, after `end()`: the engine's usage, else a stream's counted
   * events; nothing for a non-streamed answer without usage (its body is not read).
   */
  totals(): EndInfo | undefined {
    if (this.reported) return this.reported;
    return this.stream ? { completionTokens: this.counted } : undefined;
  }
}

/** The digits of `pattern`'s last match in `text`: the last `usage` wins, as the engine's final one. */
function lastMatch(text: string, pattern: RegExp): string | undefined {
  let digits: string | undefined;
  for (const match of text.matchAll(pattern)) digits = match[1];
  return digits;
}
