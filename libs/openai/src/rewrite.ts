// The release-time rewrite: degrade a request (add an instruction, scale its token limit) by
// splicing bytes into the raw body at the spans peekRequest found, never by parsing and
// re-serialising it. Every byte outside the edited spots is copied as it is, once. Where the
// peek does not say enough, the body is scanned here, as raw bytes and without building
// values: the messages up to the one that takes the instruction, and the top-level keys (the
// peek's spans stepped over) only when a token limit would change.

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
   * chat: where the instruction goes in a leading system message's text. When messages[0] is
   * a system message whose content is a string (or whose content's first part is a text part),
   * 'prepend' puts `instruction + "\n\n"` in front of that text, 'append' puts
   * `"\n\n" + instruction` after it. A system message whose content is null gets the
   * instruction as its content; one whose content is another array gets a text part first.
   * Without a system message first, the instruction goes in front of the first user message's
   * text in either mode. Never a new message: many chat templates refuse a second system
   * message (vLLM's examples/tool_chat_template_mistral3.jinja), and some any system message
   * (Gemma's "System role not supported"). No instruction at all for a request with which vLLM
   * returns or truncates its prompt: see `promptMustStay`.
   */
  readonly systemPrompt: 'prepend' | 'append';
  /**
   * completion: put `${instruction}\n\n` in front of a string prompt (or a one-string array
   * prompt); false = leave the prompt untouched. Token-id prompts are never touched, nor is a
   * prompt vLLM returns or truncates (`echo`, `prompt_logprobs`, `return_token_ids`,
   * `truncate_prompt_tokens`: see `promptMustStay`).
   */
  readonly completionPrefix: boolean;
  /**
   * Scale for the token limit: `max_tokens` and/or `max_completion_tokens`, whichever the client
   * sent (both if both), rounded, floored at `minMaxTokens` and at the request's `min_tokens`,
   * never raised above the original. A limit the client left to the context window is never
   * set, and a request that constrains its output (chat with `tools` unless tool_choice is
   * `none`, tool_choice `required` or a named tool, response_format other than `text`, vLLM's
   * guided_* or structured_outputs) keeps its limits: see `plannedMaxTokens` and the README.
   * 1 = leave token limits alone. A finite number ≥ 0.
   */
  readonly maxTokensFactor: number;
  /** Floor of a scaled limit; an integer ≥ 1 (vLLM refuses `max_tokens` 0). */
  readonly minMaxTokens: number;
  /**
   * Ignored; an integer ≥ 1 when given. It used to be scaled where the client left the limit
   * to the context window, which vLLM refuses once prompt + limit exceeds max_model_len.
   */
  readonly defaultMaxTokens?: number | undefined;
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
    if (key === 'defaultMaxTokens' && v === undefined) continue;
    if (!Number.isSafeInteger(v) || v! < 1) {
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
 * completions with `"max_tokens": null`), and then undefined back: such a limit is never set.
 * Equal to `original` when the rewrite leaves it. Says nothing of requests that constrain
 * their output, whose limits the rewrite leaves alone whatever this gives.
 */
export function plannedMaxTokens(
  original: number | undefined,
  plan: RewritePlan,
  minTokens = 0,
): number | undefined {
  checkPlan(plan);
  return original === undefined ? undefined : planned(original, plan, minTokens);
}

function planned(original: number, plan: RewritePlan, minTokens: number): number {
  if (plan.maxTokensFactor === 1) return original;
  // vLLM refuses min_tokens > max_tokens (SamplingParams._verify_args, vllm/sampling_params.py),
  // so min_tokens is a floor too. Never above the original: a request whose min_tokens is
  // already above it is refused by vLLM as the client sent it, and is left so.
  const scaled = Math.round(original * plan.maxTokensFactor);
  return Math.min(original, Math.max(plan.minMaxTokens, minTokens, scaled));
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
  private part: Buffer | undefined;
  private partComma: Buffer | undefined;
  private string: Buffer | undefined;
  private suffix: Buffer | undefined;
  private prefix: Buffer | undefined;
  constructor(private readonly instruction: string) {}
  /** `{"type":"text","text":"…"}`, with a ',' after it when more parts follow. */
  textPart(comma: boolean): Buffer {
    if (comma) {
      return (this.partComma ??= utf8(`{"type":"text","text":"${escaped(this.instruction)}"},`));
    }
    return (this.part ??= utf8(`{"type":"text","text":"${escaped(this.instruction)}"}`));
  }
  /** `"…"`: the instruction as a whole JSON string. */
  quoted(): Buffer {
    return (this.string ??= utf8(JSON.stringify(this.instruction)));
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
  inside(p.tools, 'tools');
  inside(p.documents, 'documents');
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
  // scanString may read the body a word at a time while it is bound.
  bindWords(body);
  try {
    // The token limit is scaled below even where the prompt must stay as it is.
    if (instruction !== undefined && instruction !== '' && !promptMustStay(peeked, plan.endpoint)) {
      const text = encoded(instruction);
      if (plan.endpoint === 'chat') {
        if (peeked.messages !== undefined) {
          const edit = instructMessages(body, peeked.messages, text, plan.systemPrompt);
          if (edit !== undefined) edits.push(edit);
        }
      } else if (plan.completionPrefix && peeked.prompt !== undefined) {
        const edit = prefixPrompt(body, peeked.prompt, text);
        if (edit !== undefined) edits.push(edit);
      }
    }
    if (plan.maxTokensFactor !== 1) {
      const limits = limitEdits(body, peeked, plan);
      // Only a request whose limits would change pays for the scan of its top-level keys.
      if (limits.length > 0 && !constrainsOutput(body, peeked, plan.endpoint)) {
        edits.push(...limits);
      }
    }
  } finally {
    releaseWords();
  }
  return edits.length === 0 ? asBuffer(body) : splice(body, edits);
}

/**
 * Whether vLLM would hand the client back, or score, or cut, the prompt it is given, so that
 * an instruction added to it would reach the client as part of their own prompt, or change
 * what of it the engine keeps. On both endpoints:
 * - `echo`: completions send the prompt back ahead of the answer
 *   (vllm/entrypoints/openai/completion/serving.py); chat sends the last message back when its
 *   role is the answer's, i.e. with `add_generation_prompt: false` (`get_chat_request_role`,
 *   vllm/entrypoints/openai/chat_completion/serving.py). On both, echo without
 *   `prompt_logprobs` sets it to `logprobs` / `top_logprobs` (`to_sampling_params`,
 *   completion/protocol.py and chat_completion/protocol.py), so the prompt's tokens come back
 *   scored, instruction included.
 * - `prompt_logprobs`, any value but null (0 included): the response's `prompt_logprobs`.
 * - `return_token_ids`: the response's `prompt_token_ids`.
 * - `truncate_prompt_tokens`: the prompt is cut to N tokens, by default keeping the last N
 *   (vllm/renderers/params.py `_token_truncation`): the instruction would be cut in part or
 *   whole, or, where the first N are kept, push the end of the client's prompt out.
 * On chat only, `return_prompt_text`: the response's `prompt_text`, the rendered prompt
 * (completions have no such field and ignore it).
 */
function promptMustStay(p: PeekedRequest, endpoint: 'chat' | 'completion'): boolean {
  return (
    p.echo === true ||
    p.promptLogprobs ||
    p.returnTokenIds === true ||
    p.truncatePromptTokens ||
    (endpoint === 'chat' && p.returnPromptText === true)
  );
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

// --- chat: the instruction ----------------------------------------------------------------

/**
 * The edit that puts the instruction into `messages`, never as a message of its own: into
 * messages[0] when that is a system message, else into the first user message. Undefined when
 * neither is there or its content has no form the instruction can join (absent, a number …).
 * Elements are scanned in order up to that message, each member loop skipping nested values
 * by counting brackets; nothing after it is read.
 */
function instructMessages(
  b: Uint8Array,
  messages: ByteSpan,
  text: Encoded,
  mode: 'prepend' | 'append',
): Edit | undefined {
  const end = messages.end - 1; // the ']'
  let i = skipWhitespace(b, messages.start + 1, end);
  let first = true;
  while (i < end) {
    let role = NO_ROLE;
    let content = -1;
    let contentEnd = -1;
    let next: number;
    if (b[i] === 0x7b /* { */) {
      next = eachMember(b, i, end, (key, keyEnd, keyEscaped, value, valueEnd, valueEscaped) => {
        const id = memberKey(b, key, keyEnd, keyEscaped);
        if (id === ROLE) {
          role =
            b[value] === 0x22 /* " */ ? roleOf(b, value + 1, valueEnd - 1, valueEscaped) : NO_ROLE;
        } else if (id === CONTENT) {
          content = value;
          contentEnd = valueEnd;
        }
      });
    } else {
      next = b[i] === 0x22 /* " */ ? scanString(b, i + 1, end) : skipOther(b, i, end);
    }
    // A system message first takes it (never falling through to a user message: a second
    // place for the instruction is no better than none); else the first user message does.
    if (first && role === SYSTEM) {
      return content < 0 ? undefined : instructContent(b, content, contentEnd, text, mode);
    }
    if (role === USER) {
      return content < 0 ? undefined : instructContent(b, content, contentEnd, text, 'prepend');
    }
    first = false;
    i = skipWhitespace(b, next, end);
    if (b[i] !== 0x2c /* , */) break;
    i = skipWhitespace(b, i + 1, end);
  }
  return undefined;
}

/**
 * The edit for a message whose `content` value is [s, e): a string, or the first part of an
 * array when that is a text part, gets the instruction joined to its text; another array a
 * text part first; null the instruction as a string. Undefined for anything else.
 */
function instructContent(
  b: Uint8Array,
  s: number,
  e: number,
  text: Encoded,
  mode: 'prepend' | 'append',
): Edit | undefined {
  const c = b[s];
  let join: ByteSpan | undefined;
  if (c === 0x22 /* " */) {
    join = { start: s + 1, end: e - 1 };
  } else if (c === 0x5b /* [ */) {
    join = firstTextPart(b, s, e);
    if (join === undefined) {
      const empty = skipWhitespace(b, s + 1, e) === e - 1; // only ']' is left
      return { start: s + 1, end: s + 1, bytes: text.textPart(!empty) };
    }
  } else if (c === 0x6e /* n: null */) {
    return { start: s, end: e, bytes: text.quoted() };
  } else {
    return undefined;
  }
  return mode === 'prepend'
    ? { start: join.start, end: join.start, bytes: text.prefixed() }
    : { start: join.end, end: join.end, bytes: text.appended() };
}

const OTHER = 0;
const ROLE = 1;
const CONTENT = 2;
/** Longest raw key that can unescape to `content`: 7 characters, 6 bytes each as \uXXXX. */
const MAX_ESCAPED_KEY = 7 * 6;

const NO_ROLE = 0;
const SYSTEM = 1;
const USER = 2;

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

/** `SYSTEM` or `USER` when the string content [s, e) is that role (after unescaping). */
function roleOf(b: Uint8Array, s: number, e: number, isEscaped: boolean): number {
  if (isEscaped) {
    if (e - s > 6 * 6) return NO_ROLE;
    const role = decodeString(b, s, e);
    return role === 'system' ? SYSTEM : role === 'user' ? USER : NO_ROLE;
  }
  if (
    e - s === 6 &&
    b[s] === 0x73 /* s */ &&
    b[s + 1] === 0x79 /* y */ &&
    b[s + 2] === 0x73 /* s */ &&
    b[s + 3] === 0x74 /* t */ &&
    b[s + 4] === 0x65 /* e */ &&
    b[s + 5] === 0x6d /* m */
  ) {
    return SYSTEM;
  }
  if (
    e - s === 4 &&
    b[s] === 0x75 /* u */ &&
    b[s + 1] === 0x73 /* s */ &&
    b[s + 2] === 0x65 /* e */ &&
    b[s + 3] === 0x72 /* r */
  ) {
    return USER;
  }
  return NO_ROLE;
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
 * The `text` string of the first element of the array at [i, n) when that element is an
 * object with a string `text` and, if it has a `type`, the type `text` (vLLM's
 * ChatCompletionContentPartTextParam). Duplicate keys resolve as JSON.parse does.
 */
function firstTextPart(b: Uint8Array, i: number, n: number): ByteSpan | undefined {
  if (b[i] !== 0x5b /* [ */) return undefined;
  let text: ByteSpan | undefined;
  let typeIsText = true;
  const first = skipWhitespace(b, i + 1, n);
  const after = eachMember(b, first, n, (key, keyEnd, keyEscaped, value, end, valueEscaped) => {
    const name = partKey(b, key, keyEnd, keyEscaped);
    const isString = b[value] === 0x22; /* " */
    if (name === 'text') text = isString ? { start: value + 1, end: end - 1 } : undefined;
    else if (name === 'type')
      typeIsText = isString && partKey(b, value + 1, end - 1, valueEscaped) === 'text';
  });
  return after >= 0 && typeIsText ? text : undefined;
}

/**
 * Calls `member` for each member of the object at `i` (its '{'; `n` bounds the scan), in
 * order: the key's raw bytes are [key, keyEnd), the value is [value, end) (a string there
 * with its quotes), and the escape flags say whether the key's or a string value's bytes hold
 * an escape. Nested values are skipped by depth counting, without recursion. Returns the
 * position after the object's '}', or -1 when there is no object at `i`.
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
): number {
  if (b[i] !== 0x7b /* { */) return -1;
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
  return i + 1;
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

/** The edits that scale the token limits, before the check for a constrained output. */
function limitEdits(b: Uint8Array, p: PeekedRequest, plan: RewritePlan): Edit[] {
  const edits: Edit[] = [];
  const minTokens = p.minTokens ?? 0;
  // Every limit the client sent is scaled, on both endpoints (on completions vLLM ignores
  // max_completion_tokens, an extra field of its CompletionRequest, so scaling it changes nothing).
  for (const [original, span] of [
    [p.maxTokens, p.maxTokensSpan],
    [p.maxCompletionTokens, p.maxCompletionTokensSpan],
  ] as const) {
    if (original === undefined || span === undefined) continue;
    const value = planned(original, plan, minTokens);
    if (value !== original)
      edits.push({ start: span.start, end: span.end, bytes: utf8(`${value}`) });
  }
  // A limit the client left to vLLM is set only where vLLM's own is known, and only lower.
  // Chat without either limit and completions with "max_tokens": null get the rest of the
  // context window: get_max_tokens (vllm/entrypoints/utils.py) takes max_model_len minus the
  // prompt's tokens (or less, the model's generation-config default). An explicit limit is
  // refused with a 400 once prompt + limit exceeds max_model_len (OpenAIServing._validate_input,
  // vllm/entrypoints/openai/serving_engine.py), and max_model_len is not known here: any value
  // set could turn a long prompt that fits into a refusal caused by load. So none is set.
  if (plan.endpoint === 'chat' || p.maxTokensSpan !== undefined) return edits;
  // No max_tokens key on completions: vLLM's default of 16. Set only when scaling lowers it.
  const value = planned(VLLM_COMPLETION_MAX_TOKENS, plan, minTokens);
  if (value === VLLM_COMPLETION_MAX_TOKENS) return edits;
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
  return edits;
}

// --- constrained output ---------------------------------------------------------------------

/**
 * Top-level keys that constrain the output to a grammar (vLLM's structured outputs), by the
 * index their last occurrence is recorded at. A cut answer there is no shorter answer but an
 * invalid one: JSON that does not parse, a tool call without its arguments
 * (vllm/entrypoints/openai/chat_completion/serving.py, serving_chat.py before the split).
 */
const CONSTRAINT_KEYS = new Map<string, number>([
  ['tool_choice', 0],
  ['response_format', 1],
  ['guided_json', 2],
  ['guided_regex', 3],
  ['guided_choice', 4],
  ['guided_grammar', 5],
  ['structured_outputs', 6],
]);
const TOOL_CHOICE = 0;
const RESPONSE_FORMAT = 1;
/** Longest raw key that can unescape to one of them: 18 characters as \uXXXX. */
const MAX_ESCAPED_CONSTRAINT_KEY = 18 * 6;

/** The index of the constraint key [s, e) names (after unescaping), else -1. */
function constraintKey(b: Uint8Array, s: number, e: number, isEscaped: boolean): number {
  const length = e - s;
  if (isEscaped) {
    if (length > MAX_ESCAPED_CONSTRAINT_KEY) return -1;
  } else {
    if (length < 11 || length > 18) return -1;
    const c = b[s];
    // t(ool_choice), r(esponse_format), g(uided_*), s(tructured_outputs)
    if (c !== 0x74 && c !== 0x72 && c !== 0x67 && c !== 0x73) return -1;
  }
  return CONSTRAINT_KEYS.get(decodeString(b, s, e)) ?? -1;
}

/** The string [s, e) (inside its quotes) when it is at most `max` raw bytes, else undefined. */
function shortString(b: Uint8Array, s: number, e: number, max: number): string | undefined {
  return e - s <= max ? decodeString(b, s, e) : undefined;
}

/** Whether the value [s, e) is the string `none` (escapes allowed). */
function isNone(b: Uint8Array, s: number, e: number): boolean {
  return b[s] === 0x22 /* " */ && shortString(b, s + 1, e - 1, 4 * 6) === 'none';
}

/**
 * Whether `tools` is an array with at least one element. vLLM refuses an empty one (or, before
 * it did, treated it as no tools: `check_tool_usage` only defaults tool_choice for a truthy
 * `tools`).
 */
function listsTools(b: Uint8Array, tools: ByteSpan | undefined): boolean {
  if (tools === undefined || b[tools.start] !== 0x5b /* [ */) return false;
  return b[skipWhitespace(b, tools.start + 1, tools.end)] !== 0x5d; /* ] */
}

/** Whether the value [s, e) of constraint key `id` constrains the output. */
function constrains(b: Uint8Array, id: number, s: number, e: number): boolean {
  const c = b[s];
  if (c === 0x6e /* n: null, as if absent */) return false;
  if (id === TOOL_CHOICE) {
    // "auto" and "none" leave the model free; "required" and a named tool
    // ({"type":"function","function":{"name":…}}) force a tool call, whose arguments are JSON.
    if (c !== 0x22 /* " */) return true;
    const choice = shortString(b, s + 1, e - 1, 4 * 6);
    return choice !== 'auto' && choice !== 'none';
  }
  if (id === RESPONSE_FORMAT) {
    // {"type":"text"} is plain text; json_object, json_schema and structural_tag are not.
    let text = false;
    const after = eachMember(b, s, e, (key, keyEnd, keyEscaped, value, end, valueEscaped) => {
      if (partKey(b, key, keyEnd, keyEscaped) === 'type') {
        text =
          b[value] === 0x22 /* " */ &&
          (valueEscaped
            ? shortString(b, value + 1, end - 1, 4 * 6) === 'text'
            : partKey(b, value + 1, end - 1, false) === 'text');
      }
    });
    return !(after >= 0 && text);
  }
  // guided_json, guided_regex, guided_choice, guided_grammar, structured_outputs: any value.
  return true;
}

/**
 * Whether the request constrains its output (see CONSTRAINT_KEYS), or, on chat, lists tools
 * with a tool_choice other than "none": one pass over the top-level members, where the values
 * the peek found (messages, prompt, tools, documents) are stepped over by their spans and the
 * rest skipped by counting brackets. The last of duplicate keys counts, as with JSON.parse and
 * Python's json.loads.
 *
 * Tools: vLLM sets tool_choice to "auto" when `tools` comes without it (`check_tool_usage`,
 * vllm/entrypoints/openai/chat_completion/protocol.py; protocol.py in older trees), and with
 * "auto" (or an explicit null) the model may answer with a tool call, which the tool parser
 * reads as JSON (vllm/entrypoints/openai/chat_completion/serving.py parses deltas whenever
 * tool_choice is not "none"). Cut short, the call does not parse and the client gets the raw
 * `<tool_call>{"name":…` text with finish_reason "length". Only "none" leaves the answer text.
 * Completions have no tools (vLLM ignores the field there), so they count only on chat.
 */
function constrainsOutput(
  b: Uint8Array,
  p: PeekedRequest,
  endpoint: 'chat' | 'completion',
): boolean {
  const n = p.objectEnd + 1;
  const known = [p.messages, p.prompt, p.tools, p.documents];
  let found = 0; // bit k: the last constraint key k seen constrains
  let toolChoiceNone = false; // whether the last tool_choice is the string none
  let i = skipWhitespace(b, p.objectStart + 1, n);
  while (i < n && b[i] === 0x22 /* " */) {
    const key = i + 1;
    i = scanString(b, key, n);
    const id = constraintKey(b, key, i - 1, lastStringEscaped());
    i = skipWhitespace(b, i, n); // to ':'
    const value = skipWhitespace(b, i + 1, n);
    let end = -1;
    for (const span of known) if (span !== undefined && span.start === value) end = span.end;
    if (end < 0)
      end = b[value] === 0x22 /* " */ ? scanString(b, value + 1, n) : skipOther(b, value, n);
    if (id >= 0) {
      if (constrains(b, id, value, end)) found |= 1 << id;
      else found &= ~(1 << id);
      if (id === TOOL_CHOICE) toolChoiceNone = isNone(b, value, end);
    }
    i = skipWhitespace(b, end, n);
    if (b[i] !== 0x2c /* , */) break; // '}': the object ends
    i = skipWhitespace(b, i + 1, n);
  }
  if (found !== 0) return true;
  return endpoint === 'chat' && !toolChoiceNone && listsTools(b, p.tools);
}
