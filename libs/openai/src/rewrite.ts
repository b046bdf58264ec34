// The release-time rewrite: degrade a request (add an instruction, scale its token limit) by
// splicing bytes into the raw body at the spans peekRequest found, never by parsing and
// re-serialising it. Every byte outside the edited spots is copied as it is, once.

import { Buffer } from 'node:buffer';
import { decodeString } from './decode.js';
import { bindWords, lastStringEscaped, releaseWords, scanString, skipWhitespace } from './scan.js';
import type { ByteSpan, PeekedRequest } from './types.js';

/** How to degrade one request; see the README's "Rewrite" section. */
export interface RewritePlan {
  /** Which API the body is for: `chat` (`messages`) or `completion` (`prompt`). */
  readonly endpoint: 'chat' | 'completion';
  /** Text to add; undefined (or '') = no instruction. */
  readonly instruction?: string | undefined;
  /**
   * chat: where the instruction goes in the leading system message. When messages[0] is a
   * system message whose content is a string (or whose content's first part is a text part),
   * the instruction joins that text: 'prepend' puts `instruction + "\n\n"` in front of it,
   * 'append' puts `"\n\n" + instruction` after it. Otherwise a new
   * `{"role":"system","content":instruction}` becomes messages[0]. Never a second system
   * message: many chat templates take only messages[0] as the system prompt and refuse any
   * other (vLLM's examples/tool_chat_template_mistral3.jinja).
   */
  readonly systemPrompt: 'prepend' | 'append';
  /**
   * completion: put `${instruction}\n\n` in front of a string prompt (or a one-string array
   * prompt); false = leave the prompt untouched. Token-id prompts are never touched, nor is a
   * prompt the engine will echo back (`echo` not false).
   */
  readonly completionPrefix: boolean;
  /**
   * Scale for the token limit: `max_tokens` and/or `max_completion_tokens`, whichever the client
   * sent (both if both), rounded, floored at `minMaxTokens` and at the request's `min_tokens`,
   * never raised above the original. A limit the client left to vLLM is set only when vLLM's
   * own would be larger: see `plannedMaxTokens` and the README. 1 = leave token limits alone.
   * A finite number ≥ 0.
   */
  readonly maxTokensFactor: number;
  /** Floor of a scaled limit; an integer ≥ 1 (vLLM refuses `max_tokens` 0). */
  readonly minMaxTokens: number;
  /**
   * The limit scaled when vLLM's own would be the rest of the context window (per model): chat
   * without either limit, completions with `"max_tokens": null`. An integer ≥ 1.
   */
  readonly defaultMaxTokens: number;
}

/**
 * What vLLM generates for a completions request without a `max_tokens` key: its
 * `CompletionRequest` declares `max_tokens: int | None = 16`
 * (vllm/entrypoints/openai/completion/protocol.py; vllm/entrypoints/openai/protocol.py before
 * the split). An explicit null is not this default: it reaches `get_max_tokens`
 * (vllm/entrypoints/utils.py) as None, which leaves the rest of the context window.
 */
export const VLLM_COMPLETION_MAX_TOKENS = 16;

function checkPlan(plan: RewritePlan): void {
  const f = plan.maxTokensFactor;
  if (typeof f !== 'number' || !Number.isFinite(f) || f < 0) {
    throw new RangeError(`maxTokensFactor must be a finite number >= 0, got ${String(f)}`);
  }
  for (const key of ['minMaxTokens', 'defaultMaxTokens'] as const) {
    const v = plan[key];
    if (!Number.isSafeInteger(v) || v < 1) {
      throw new RangeError(`${key} must be an integer >= 1, got ${String(v)}`);
    }
  }
  if (plan.instruction !== undefined && typeof plan.instruction !== 'string') {
    throw new RangeError('instruction must be a string or undefined');
  }
}

/**
 * The token limit the rewrite sets for a field whose value was `original`, in a request whose
 * `min_tokens` is `minTokens` (0 when it sent none). `original` is the limit vLLM would apply:
 * the client's, or `VLLM_COMPLETION_MAX_TOKENS` for a completions request without the key;
 * undefined when vLLM would run to the end of the context window (chat without either limit,
 * completions with `"max_tokens": null`), so `defaultMaxTokens` is scaled. Undefined when the
 * factor is 1 and there was no original: nothing is set then. Equal to `original` when the
 * rewrite leaves it.
 */
export function plannedMaxTokens(
  original: number | undefined,
  plan: RewritePlan,
  minTokens = 0,
): number | undefined {
  checkPlan(plan);
  return planned(original, plan, minTokens);
}

function planned(
  original: number | undefined,
  plan: RewritePlan,
  minTokens: number,
): number | undefined {
  if (plan.maxTokensFactor === 1) return original;
  const f = plan.maxTokensFactor;
  if (original === undefined) {
    // vLLM would have run to the end of the context, which is at least min_tokens when the
    // request is valid at all: the scaled default, raised to min_tokens, lowers nothing vLLM
    // accepts into a refusal.
    const d = plan.defaultMaxTokens;
    return Math.max(minTokens, Math.min(d, Math.max(plan.minMaxTokens, Math.round(d * f))));
  }
  // vLLM refuses min_tokens > max_tokens (SamplingParams._verify_args, vllm/sampling_params.py),
  // so min_tokens is a floor too. Never above the original: a request whose min_tokens is
  // already above it is refused by vLLM as the client sent it, and is left so.
  return Math.min(original, Math.max(plan.minMaxTokens, minTokens, Math.round(original * f)));
}

/** One splice: bytes [start, end) of the body are replaced by `bytes` (an insert when equal). */
interface Edit {
  readonly start: number;
  readonly end: number;
  readonly bytes: Uint8Array;
}

const utf8 = (text: string): Buffer => Buffer.from(text, 'utf8');

/** `text` as the inside of a JSON string (no quotes): JSON.stringify's escaping. */
const escaped = (text: string): string => JSON.stringify(text).slice(1, -1);

/** The bytes an instruction is spliced in as, escaped and encoded once per instruction. */
class Encoded {
  private message: Buffer | undefined;
  private messageComma: Buffer | undefined;
  private suffix: Buffer | undefined;
  private prefix: Buffer | undefined;
  constructor(private readonly instruction: string) {}
  /** `{"role":"system","content":"…"}`, with a ',' after it when more elements follow. */
  systemMessage(comma: boolean): Buffer {
    if (comma) {
      return (this.messageComma ??= utf8(
        `{"role":"system","content":"${escaped(this.instruction)}"},`,
      ));
    }
    return (this.message ??= utf8(`{"role":"system","content":"${escaped(this.instruction)}"}`));
  }
  /** `\n\n…`: the end of a system prompt's string. */
  appended(): Buffer {
    return (this.suffix ??= utf8(escaped(`\n\n${this.instruction}`)));
  }
  /** `…\n\n`: the start of a prompt string. */
  prefixed(): Buffer {
    return (this.prefix ??= utf8(escaped(`${this.instruction}\n\n`)));
  }
}

// Profiles are few and their instructions fixed, so the encodings are kept (never mutated:
// Buffer.concat copies them). Pure memoisation; the cache is dropped whole when it fills.
const ENCODED = new Map<string, Encoded>();
const ENCODED_MAX = 64;

function encoded(instruction: string): Encoded {
  let e = ENCODED.get(instruction);
  if (e === undefined) {
    if (ENCODED.size >= ENCODED_MAX) ENCODED.clear();
    e = new Encoded(instruction);
    ENCODED.set(instruction, e);
  }
  return e;
}

function asBuffer(b: Uint8Array): Buffer {
  return Buffer.isBuffer(b) ? b : Buffer.from(b.buffer, b.byteOffset, b.length);
}

function mismatch(what: string): RangeError {
  return new RangeError(`rewriteRequest: the peeked ${what} does not match this body`);
}

/** Cheap checks that `peeked` came from `b`: the bytes its spans start and end on. */
function checkPeeked(b: Uint8Array, p: PeekedRequest): void {
  const { objectStart: os, objectEnd: oe } = p;
  if (!(os >= 0 && oe > os && oe < b.length && b[os] === 0x7b && b[oe] === 0x7d)) {
    throw mismatch('object');
  }
  const inside = (s: ByteSpan | undefined, what: string): void => {
    if (s !== undefined && !(s.start > os && s.end > s.start && s.end <= oe)) throw mismatch(what);
  };
  inside(p.messages, 'messages');
  inside(p.prompt, 'prompt');
  inside(p.maxTokensSpan, 'max_tokens');
  inside(p.maxCompletionTokensSpan, 'max_completion_tokens');
  if (p.messages !== undefined) {
    if (b[p.messages.start] !== 0x5b || b[p.messages.end - 1] !== 0x5d) throw mismatch('messages');
  }
}

/**
 * Rewrites a request body that `peeked` (peekRequest's result for exactly these bytes)
 * describes, following `plan`. Returns `body` itself when nothing changes, else a new buffer
 * built in one pass from slices of `body` and the inserted bytes. Throws RangeError for a bad
 * plan or a `peeked` that does not fit the body.
 */
export function rewriteRequest(
  body: Buffer | Uint8Array,
  peeked: PeekedRequest,
  plan: RewritePlan,
): Buffer {
  checkPlan(plan);
  checkPeeked(body, peeked);
  const edits: Edit[] = [];
  const instruction = plan.instruction;
  if (instruction !== undefined && instruction !== '') {
    const text = encoded(instruction);
    // scanString may read the body a word at a time while it is bound.
    bindWords(body);
    try {
      if (plan.endpoint === 'chat') {
        if (peeked.messages !== undefined) {
          edits.push(instructMessages(body, peeked.messages, text, plan.systemPrompt));
        }
      } else if (plan.completionPrefix && peeked.prompt !== undefined && peeked.echo !== true) {
        // With echo, vLLM returns the prompt it was given ahead of the answer
        // (vllm/entrypoints/openai/completion/serving.py): a prefix would come back to the
        // client as if it were part of their prompt. The token limit is still scaled below.
        const edit = prefixPrompt(body, peeked.prompt, text);
        if (edit !== undefined) edits.push(edit);
      }
    } finally {
      releaseWords();
    }
  }
  if (plan.maxTokensFactor !== 1) scaleLimits(body, peeked, plan, edits);
  return edits.length === 0 ? asBuffer(body) : splice(body, edits);
}

/** The body with `edits` applied, built from slices in ascending order with one copy. */
function splice(b: Uint8Array, edits: Edit[]): Buffer {
  edits.sort((x, y) => x.start - y.start || x.end - y.end);
  const parts: Uint8Array[] = [];
  let at = 0;
  let length = b.length;
  for (const e of edits) {
    if (e.start < at) throw new Error('rewriteRequest: overlapping edits (a bug)');
    if (e.start > at) parts.push(b.subarray(at, e.start));
    parts.push(e.bytes);
    length += e.bytes.length - (e.end - e.start);
    at = e.end;
  }
  if (at < b.length) parts.push(b.subarray(at));
  return Buffer.concat(parts, length);
}

// --- chat: the system instruction ---------------------------------------------------------

function instructMessages(
  b: Uint8Array,
  messages: ByteSpan,
  text: Encoded,
  mode: 'prepend' | 'append',
): Edit {
  const first = skipWhitespace(b, messages.start + 1, messages.end);
  const empty = first === messages.end - 1; // only ']' is left
  if (!empty) {
    const system = systemText(b, first, messages.end);
    if (system !== undefined) {
      return mode === 'prepend'
        ? { start: system.start, end: system.start, bytes: text.prefixed() }
        : { start: system.end, end: system.end, bytes: text.appended() };
    }
  }
  return { start: messages.start + 1, end: messages.start + 1, bytes: text.systemMessage(!empty) };
}

const OTHER = 0;
const ROLE = 1;
const CONTENT = 2;
/** Longest raw key that can unescape to `content`: 7 characters, 6 bytes each as \uXXXX. */
const MAX_ESCAPED_KEY = 7 * 6;

/** Which member the raw key bytes [s, e) name, compared after unescaping. */
function memberKey(b: Uint8Array, s: number, e: number, isEscaped: boolean): number {
  if (isEscaped) {
    if (e - s > MAX_ESCAPED_KEY) return OTHER;
    const key = decodeString(b, s, e);
    return key === 'role' ? ROLE : key === 'content' ? CONTENT : OTHER;
  }
  if (
    e - s === 4 &&
    b[s] === 0x72 /* r */ &&
    b[s + 1] === 0x6f /* o */ &&
    b[s + 2] === 0x6c /* l */ &&
    b[s + 3] === 0x65 /* e */
  ) {
    return ROLE;
  }
  if (
    e - s === 7 &&
    b[s] === 0x63 /* c */ &&
    b[s + 1] === 0x6f /* o */ &&
    b[s + 2] === 0x6e /* n */ &&
    b[s + 3] === 0x74 /* t */ &&
    b[s + 4] === 0x65 /* e */ &&
    b[s + 5] === 0x6e /* n */ &&
    b[s + 6] === 0x74 /* t */
  ) {
    return CONTENT;
  }
  return OTHER;
}

/** Whether the string content [s, e) is `system`, compared after unescaping. */
function isSystem(b: Uint8Array, s: number, e: number, isEscaped: boolean): boolean {
  if (isEscaped) return e - s <= 6 * 6 && decodeString(b, s, e) === 'system';
  return (
    e - s === 6 &&
    b[s] === 0x73 /* s */ &&
    b[s + 1] === 0x79 /* y */ &&
    b[s + 2] === 0x73 /* s */ &&
    b[s + 3] === 0x74 /* t */ &&
    b[s + 4] === 0x65 /* e */ &&
    b[s + 5] === 0x6d /* m */
  );
}

/**
 * Skips one non-string value of the validated body at `i`: a container with everything in it
 * (depth counted, no recursion), or a number or literal. Returns the position after it.
 */
function skipOther(b: Uint8Array, i: number, n: number): number {
  let c = b[i]!;
  if (c !== 0x7b /* { */ && c !== 0x5b /* [ */) {
    // A number or a literal: runs to the next structural byte or whitespace.
    while (i < n) {
      c = b[i]!;
      if (c === 0x2c || c === 0x7d || c === 0x5d || c === 0x20 || c === 0x0a) break;
      if (c === 0x0d || c === 0x09) break;
      i++;
    }
    return i;
  }
  let depth = 0;
  while (i < n) {
    c = b[i++]!;
    if (c === 0x22 /* " */) i = scanString(b, i, n);
    else if (c === 0x7b /* { */ || c === 0x5b /* [ */) depth++;
    else if ((c === 0x7d /* } */ || c === 0x5d) /* ] */ && --depth === 0) return i;
  }
  return i;
}

/**
 * The text of the system message at `i` (messages[0]) that an instruction joins, as the bytes
 * inside its quotes: its `content` when a string, or the `text` of its content's first part
 * when that part is a text part (`[{"type":"text","text":"…"}, …]`, vLLM's
 * ChatCompletionContentPartTextParam). Undefined when `i` is not a system message or its
 * content is neither. Duplicate keys resolve as JSON.parse does: the last one counts.
 */
function systemText(b: Uint8Array, i: number, n: number): ByteSpan | undefined {
  let system = false;
  let content: ByteSpan | undefined;
  const isObject = eachMember(b, i, n, (key, keyEnd, keyEscaped, value, end, valueEscaped) => {
    const id = memberKey(b, key, keyEnd, keyEscaped);
    const isString = b[value] === 0x22; /* " */
    if (id === ROLE) system = isString && isSystem(b, value + 1, end - 1, valueEscaped);
    else if (id === CONTENT)
      content = isString ? { start: value + 1, end: end - 1 } : firstTextPart(b, value, end);
  });
  return isObject && system ? content : undefined;
}

/**
 * The `text` string of the first element of the array at [i, n) when that element is an
 * object with a string `text` and, if it has a `type`, the type `text`.
 */
function firstTextPart(b: Uint8Array, i: number, n: number): ByteSpan | undefined {
  if (b[i] !== 0x5b /* [ */) return undefined;
  let text: ByteSpan | undefined;
  let typeIsText = true;
  const first = skipWhitespace(b, i + 1, n);
  const isObject = eachMember(b, first, n, (key, keyEnd, keyEscaped, value, end, valueEscaped) => {
    const name = partKey(b, key, keyEnd, keyEscaped);
    const isString = b[value] === 0x22; /* " */
    if (name === 'text') text = isString ? { start: value + 1, end: end - 1 } : undefined;
    else if (name === 'type')
      typeIsText = isString && partKey(b, value + 1, end - 1, valueEscaped) === 'text';
  });
  return isObject && typeIsText ? text : undefined;
}

/**
 * Calls `member` for each member of the object at `i` (its '{'; `n` bounds the scan), in
 * order: the key's raw bytes are [key, keyEnd), the value is [value, end) (a string there
 * with its quotes), and the escape flags say whether the key's or a string value's bytes hold
 * an escape. Nested values are skipped by depth counting, without recursion. False when there
 * is no object at `i`.
 */
function eachMember(
  b: Uint8Array,
  i: number,
  n: number,
  member: (
    key: number,
    keyEnd: number,
    keyEscaped: boolean,
    value: number,
    end: number,
    valueEscaped: boolean,
  ) => void,
): boolean {
  if (b[i] !== 0x7b /* { */) return false;
  i = skipWhitespace(b, i + 1, n);
  while (i < n && b[i] === 0x22 /* " */) {
    const key = i + 1;
    i = scanString(b, key, n);
    const keyEscaped = lastStringEscaped();
    const keyEnd = i - 1;
    i = skipWhitespace(b, i, n); // to ':'
    const value = skipWhitespace(b, i + 1, n);
    const isString = b[value] === 0x22; /* " */
    i = isString ? scanString(b, value + 1, n) : skipOther(b, value, n);
    member(key, keyEnd, keyEscaped, value, i, isString && lastStringEscaped());
    i = skipWhitespace(b, i, n);
    if (b[i] !== 0x2c /* , */) break; // '}': the object ends
    i = skipWhitespace(b, i + 1, n);
  }
  return true;
}

/** `text` or `type` when the string [s, e) is that word (after unescaping), else ''. */
function partKey(b: Uint8Array, s: number, e: number, isEscaped: boolean): string {
  if (isEscaped) {
    if (e - s > 4 * 6) return '';
    const word = decodeString(b, s, e);
    return word === 'text' || word === 'type' ? word : '';
  }
  if (e - s !== 4 || b[s] !== 0x74 /* t */) return '';
  if (b[s + 1] === 0x65 /* e */ && b[s + 2] === 0x78 /* x */ && b[s + 3] === 0x74 /* t */)
    return 'text';
  if (b[s + 1] === 0x79 /* y */ && b[s + 2] === 0x70 /* p */ && b[s + 3] === 0x65 /* e */)
    return 'type';
  return '';
}

// --- completion: the prompt prefix ---------------------------------------------------------

function prefixPrompt(b: Uint8Array, prompt: ByteSpan, text: Encoded): Edit | undefined {
  let at = -1;
  if (b[prompt.start] === 0x22 /* " */) {
    at = prompt.start + 1;
  } else if (b[prompt.start] === 0x5b /* [ */) {
    // Only a one-string array: ["…"]. Token ids ([1,2], [[1,2]]) and batches stay as they are.
    const first = skipWhitespace(b, prompt.start + 1, prompt.end);
    if (b[first] === 0x22 /* " */) {
      const after = skipWhitespace(b, scanString(b, first + 1, prompt.end), prompt.end);
      if (after === prompt.end - 1) at = first + 1;
    }
  }
  if (at < 0) return undefined;
  return { start: at, end: at, bytes: text.prefixed() };
}

// --- token limits ---------------------------------------------------------------------------

function scaleLimits(b: Uint8Array, p: PeekedRequest, plan: RewritePlan, edits: Edit[]): void {
  const minTokens = p.minTokens ?? 0;
  const replace = (span: ByteSpan, value: number): void => {
    edits.push({ start: span.start, end: span.end, bytes: utf8(String(value)) });
  };
  // Every limit the client sent is scaled, on both endpoints (on completions vLLM ignores
  // max_completion_tokens, an extra field of its CompletionRequest, so scaling it changes nothing).
  for (const [original, span] of [
    [p.maxTokens, p.maxTokensSpan],
    [p.maxCompletionTokens, p.maxCompletionTokensSpan],
  ] as const) {
    if (original === undefined || span === undefined) continue;
    const value = planned(original, plan, minTokens)!;
    if (value !== original) replace(span, value);
  }
  // What vLLM falls back to when the limit it reads is missing decides what may be set.
  let value: number;
  if (plan.endpoint === 'chat') {
    // ChatCompletionRequest: max_completion_tokens, else max_tokens, else the rest of the
    // context (vllm/entrypoints/openai/chat_completion/serving.py): max_tokens is set (vLLM
    // accepts it there) from the default.
    if (p.maxTokens !== undefined || p.maxCompletionTokens !== undefined) return;
    value = planned(undefined, plan, minTokens)!;
  } else if (p.maxTokens !== undefined) {
    return;
  } else if (p.maxTokensSpan !== undefined) {
    // "max_tokens": null on completions: the rest of the context, as for chat.
    value = planned(undefined, plan, minTokens)!;
  } else {
    // No max_tokens key on completions: vLLM's default of 16. Set only when scaling lowers it.
    value = planned(VLLM_COMPLETION_MAX_TOKENS, plan, minTokens)!;
    if (value === VLLM_COMPLETION_MAX_TOKENS) return;
  }
  if (p.maxTokensSpan !== undefined) {
    replace(p.maxTokensSpan, value); // "max_tokens": null, the last of its key
    return;
  }
  // A new last member, right after the last value, so whitespace before '}' stays after it.
  let last = p.objectEnd - 1;
  while (last > p.objectStart) {
    const c = b[last]!;
    if (c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09) last--;
    else break;
  }
  const empty = last === p.objectStart;
  edits.push({
    start: last + 1,
    end: last + 1,
    bytes: utf8(`${empty ? '' : ','}"max_tokens":${value}`),
  });
}
