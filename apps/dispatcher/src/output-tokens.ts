// Output tokens of one engine response, counted from the bytes the dispatcher relays anyway,
// for the fair share's charge as they stream, the tenant token counters, and the counts the
// end frame carries to the gateway (its token counters and access log).
//
// A stream is charged one token per SSE `data:` event as it passes: vLLM's streaming loop
// yields one chunk per engine step and request (vllm/entrypoints/openai/serving_chat.py,
// `chat_completion_stream_generator`, each written as `data: {json}\n\n`, the last as
// `data: [DONE]\n\n`), and a step adds one token unless speculative decoding adds more.
// An event is `data:` at the start of a line only: after a newline, or as the body's first
// bytes. Generated text cannot fake one, since JSON writes a newline inside a string as `\n`
// (two bytes, never the newline byte), so `data: x` in a token's text is not an event. An event
// may be cut anywhere by the chunks undici hands over: the few bytes of `\ndata:` and of
// `[DONE]` that a chunk ends with are carried as a count of bytes matched, never copied, and an
// event is charged in the chunk where it is known not to be `[DONE]`. The count is therefore the
// same however the body is cut.
// A chat stream's first event only names the role (`"delta":{"role":"assistant","content":""}`):
// it is not counted, which only the first event is checked for, on its whole line (kept, the
// one copy per stream, when that line spans chunks).
//
// At the end, the engine's own `usage.completion_tokens` (every non-streamed answer; a stream
// whose client asked for `stream_options.include_usage`) replaces the count. A non-streamed
// answer counts nothing before it (the job runner hands its `reported` count to the fair share,
// which settles the output it reserved at release: fair-share.ts, `outputEnded`):
// - A stream's `usage` is in its last event, just before `[DONE]`: only the body's last
//   TAIL_BYTES are searched (the chunks they span are kept by reference).
// - A non-streamed answer is kept whole until its end by the relay anyway (relay.ts, `whole`);
//   its chunks are kept by reference here too. `usage` is not always near its end: vLLM's
//   ChatCompletionResponse writes `prompt_logprobs`, `prompt_token_ids` and
//   `kv_transfer_params` after it (vllm/entrypoints/openai/protocol.py; later versions
//   vllm/entrypoints/openai/chat_completion/protocol.py), and `prompt_logprobs` holds an entry
//   per prompt token (`{"<id>":{"logprob":..,"rank":..,"decoded_token":"<text>"}}`), so with a
//   prompt of a few dozen tokens `usage` is no longer in the last kilobyte. The top-level
//   `usage` object is found by walking back from the end over the members after it, tracking
//   depth and skipping strings (a quote inside one is always escaped, so a string's opening
//   quote is the first unescaped one before its end): the member named `usage` at depth 1 is
//   the answer's, whatever text the decoded tokens carry and whatever objects (even one named
//   `usage`) the KV connector puts in `kv_transfer_params`. Only the bytes after `usage` are
//   walked, in a byte loop without calls: a few dozen without those fields, some 60 per
//   prompt token with `prompt_logprobs` (well under a microsecond per prompt token).
// A `usage` count that is not a token count (past 2^53, or so long it reads as Infinity) is
// ignored as if the engine had sent no usage: the gateway would refuse the end frame carrying
// it, and a tenant's fair-share counter charged with it would never come back down.
import { isTokenCount, type EndInfo } from '@sluice/protocol';
import { lastBytes, topLevelUsage } from './usage-scan.js';

/** An event's start: `data:` at the start of a line (the body's start counts as one). */
const LINE_DATA = Buffer.from('\ndata:');
const DONE = Buffer.from('[DONE]');
const ROLE_ONLY = Buffer.from('"delta":{"role":"assistant","content":""}');
/** A stream's last bytes searched for `usage`: its last event fits with room to spare. */
const TAIL_BYTES = 1024;
/**
 * A stream's kept chunks are trimmed to its tail once they are this many or hold this much: a
 * token costs a push, and a trim comes every few dozen of them.
 */
const KEEP_CHUNKS = 64;
const KEEP_BYTES = 64 * 1024;
const USAGE = /"completion_tokens"\s*:\s*(\d+)/g;
const PROMPT_USAGE = /"prompt_tokens"\s*:\s*(\d+)/g;

const NEWLINE = 0x0a;
const SPACE = 0x20;

// Matching an event's data against `[DONE]`: no event pending; just after `data:` (one space may
// come); otherwise how many bytes of `[DONE]` matched so far, DONE.length when all did.
const NOT_PENDING = -3;
const AFTER_DATA = -1;
const MISMATCH = -2;

export class OutputTokens {
  /** Tokens counted (and charged) so far. */
  counted = 0;
  /** What the engine's `usage` reported, read by `end()`; undefined when it sent none. */
  reported: EndInfo | undefined;
  /** The `usage` counts `end()` ignored because they are not token counts, as the engine wrote them. */
  ignored: { completionTokens?: string; promptTokens?: string } | undefined;
  /** The body's chunks, by reference: a non-streamed answer's all, a stream's last ones. */
  private readonly parts: Buffer[] = [];
  private partsBytes = 0;
  /** How many bytes of `\ndata:` the stream so far ends with; its start stands for a newline. */
  private lineStart = 1;
  /** The `[DONE]` match of an event whose data the last chunk cut short. */
  private done = NOT_PENDING;
  private firstEvent = true;
  /** The first event's line so far, while it spans chunks. */
  private firstLine: Buffer[] | undefined;

  constructor(private readonly stream: boolean) {}

  /** Tokens this chunk of the body adds: its `data:` events for a stream, none otherwise. */
  chunk(chunk: Buffer): number {
    this.parts.push(chunk);
    this.partsBytes += chunk.length;
    if (!this.stream) return 0;
    if (this.parts.length >= KEEP_CHUNKS || this.partsBytes >= KEEP_BYTES) this.trim();
    const n = this.events(chunk);
    this.counted += n;
    return n;
  }

  /**
   * At the end of the body: the tokens the engine's `usage` reports beyond those counted, 0
   * when it reports none. Negative when it reports fewer: a stream that asked for
   * `stream_options.include_usage` ends with an event of its own that carries only the usage
   * (`choices: []`; vllm/entrypoints/openai/serving_chat.py, `final_usage_chunk`), counted as
   * it passed. A first event the body ended in is charged here.
   */
  end(): number {
    let more = 0;
    if (this.firstLine !== undefined) {
      more = firstEventTokens(Buffer.concat(this.firstLine), false);
      this.firstLine = undefined;
      this.counted += more;
    }
    if (this.partsBytes === 0) return more;
    const usage = this.stream ? lastBytes(this.parts, TAIL_BYTES) : topLevelUsage(this.parts);
    if (usage === undefined) return more;
    const text = usage.toString('latin1');
    const completion = lastMatch(text, USAGE);
    if (completion === undefined) return more;
    const prompt = lastMatch(text, PROMPT_USAGE);
    const reported = Number(completion);
    const promptTokens = prompt === undefined ? undefined : Number(prompt);
    if (!isTokenCount(reported)) {
      // The usage as a whole is not trusted: its prompt count is not used either.
      this.ignored = { completionTokens: completion };
      if (prompt !== undefined && !isTokenCount(promptTokens)) this.ignored.promptTokens = prompt;
      return more;
    }
    this.reported = { completionTokens: reported };
    if (isTokenCount(promptTokens)) this.reported.promptTokens = promptTokens;
    else if (prompt !== undefined) this.ignored = { promptTokens: prompt };
    more += reported - this.counted;
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

  /** The events a stream's chunk completes: those that are tokens. */
  private events(chunk: Buffer): number {
    let n = 0;
    let from = 0;
    if (this.done !== NOT_PENDING) {
      // `data: [DO` | `NE]`: the event's data goes on here.
      n += this.matchDone(chunk, 0);
    } else if (this.firstLine !== undefined) {
      const newline = chunk.indexOf(NEWLINE);
      if (newline === -1) {
        this.firstLine.push(chunk);
        return 0;
      }
      this.firstLine.push(chunk.subarray(0, newline + 1));
      n += firstEventTokens(Buffer.concat(this.firstLine), true);
      this.firstLine = undefined;
      from = newline;
    } else if (this.lineStart > 0) {
      // `\nda` | `ta:`: the line start the last chunk ended in goes on here.
      const matched = this.lineStart;
      const need = LINE_DATA.length - matched;
      const have = Math.min(need, chunk.length);
      let same = 0;
      while (same < have && chunk[same] === LINE_DATA[matched + same]) same += 1;
      if (same === have && have < need) {
        this.lineStart = matched + have;
        return 0;
      }
      this.lineStart = 0;
      if (same === need) {
        from = need;
        n += this.event(chunk, from);
      }
    }
    for (let at = chunk.indexOf(LINE_DATA, from); at !== -1; at = chunk.indexOf(LINE_DATA, from)) {
      from = at + LINE_DATA.length;
      n += this.event(chunk, from);
    }
    this.lineStart = lineStartAtEnd(chunk);
    return n;
  }

  /** An event whose `data:` ends at `at`: 1 if it is a token, 0 if not or not known yet. */
  private event(chunk: Buffer, at: number): number {
    if (this.firstEvent) {
      this.firstEvent = false;
      const newline = chunk.indexOf(NEWLINE, at);
      if (newline !== -1) return firstEventTokens(chunk.subarray(at, newline + 1), true);
      this.firstLine = [chunk.subarray(at)];
      return 0;
    }
    this.done = AFTER_DATA;
    return this.matchDone(chunk, at);
  }

  /** Goes on matching the pending event's data against `[DONE]`: 1 once it is not that. */
  private matchDone(chunk: Buffer, from: number): number {
    let state = this.done;
    for (let i = from; i < chunk.length; i++) {
      state = stepDone(state, chunk[i]!);
      if (state === MISMATCH || state === DONE.length) {
        this.done = NOT_PENDING;
        return state === MISMATCH ? 1 : 0;
      }
    }
    this.done = state;
    return 0;
  }

  /** Drops the chunks a stream no longer needs for its last TAIL_BYTES, without a new array. */
  private trim(): void {
    let drop = 0;
    while (this.partsBytes - this.parts[drop]!.length >= TAIL_BYTES) {
      this.partsBytes -= this.parts[drop]!.length;
      drop += 1;
    }
    if (drop === 0) return;
    this.parts.copyWithin(0, drop);
    this.parts.length -= drop;
  }
}

/** The `[DONE]` match after one more byte of an event's data. */
function stepDone(state: number, byte: number): number {
  if (state === AFTER_DATA) {
    if (byte === SPACE) return 0;
    state = 0;
  }
  return byte === DONE[state] ? state + 1 : MISMATCH;
}

/**
 * Whether a stream's first event is a token, from its line after `data:` (`ended`: up to and
 * with its newline; else the body ended in it): not when it only names the role, nor `[DONE]`,
 * nor when the body ended before it said whether it is `[DONE]`.
 */
function firstEventTokens(line: Buffer, ended: boolean): number {
  if (line.includes(ROLE_ONLY)) return 0;
  let state = AFTER_DATA;
  for (let i = 0; i < line.length; i++) {
    state = stepDone(state, line[i]!);
    if (state === MISMATCH) return 1;
    if (state === DONE.length) return 0;
  }
  return ended ? 1 : 0;
}

/** How many bytes of `\ndata:` (a proper prefix: 0 to 5) the chunk ends with. */
function lineStartAtEnd(chunk: Buffer): number {
  const end = chunk.length;
  // The last newline among the last five bytes: `\ndata:` has no other.
  for (let matched = 1; matched < LINE_DATA.length && matched <= end; matched++) {
    if (chunk[end - matched] !== NEWLINE) continue;
    for (let j = 1; j < matched; j++) if (chunk[end - matched + j] !== LINE_DATA[j]) return 0;
    return matched;
  }
  return 0;
}

/** The digits of `pattern`'s last match in `text`: the last `usage` wins, as the engine's final one. */
function lastMatch(text: string, pattern: RegExp): string | undefined {
  let digits: string | undefined;
  for (const match of text.matchAll(pattern)) digits = match[1];
  return digits;
}
