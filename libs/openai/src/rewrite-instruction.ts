// Where the instruction goes: the edit that joins it to a chat message's text, found by
// scanning `messages` as raw bytes up to that message, or puts it in front of a completion
// prompt; and the instruction's bytes, escaped and encoded once per instruction.

import { Buffer } from 'node:buffer';
import { decodeString } from './decode.js';
import type { Edit } from './rewrite-edit.js';
import { utf8 } from './rewrite-edit.js';
import { eachMember, partKey, skipOther } from './rewrite-members.js';
import { scanString, skipWhitespace } from './scan.js';
import type { ByteSpan } from './types.js';

/** `text` as the inside of a JSON string (no quotes): JSON.stringify's escaping. */
const escaped = (text: string): string => JSON.stringify(text).slice(1, -1);

/** The bytes an instruction is spliced in as, escaped and encoded once per instruction. */
export class Encoded {
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

export function encoded(instruction: string): Encoded {
  let e = ENCODED.get(instruction);
  if (e === undefined) {
    if (ENCODED.size >= ENCODED_MAX) ENCODED.clear();
    e = new Encoded(instruction);
    ENCODED.set(instruction, e);
  }
  return e;
}

// --- chat: the instruction ----------------------------------------------------------------

/**
 * The edit that puts the instruction into `messages`, never as a message of its own: into
 * messages[0] when that is a system message, else into the first user message. Undefined when
 * neither is there or its content has no form the instruction can join (absent, a number …).
 * Elements are scanned in order up to that message, each member loop skipping nested values
 * by counting brackets; nothing after it is read.
 */
export function instructMessages(
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

// --- completion: the prompt prefix ---------------------------------------------------------

export function prefixPrompt(b: Uint8Array, prompt: ByteSpan, text: Encoded): Edit | undefined {
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
