import { Buffer, isUtf8 } from 'node:buffer';
import { expect } from 'vitest';
import { peekRequest, RequestPeekError } from '../src/index.js';
import type { PeekedRequest } from '../src/index.js';

export const bytes = (text: string): Buffer => Buffer.from(text, 'utf8');

/** Peeks `body`, expecting a RequestPeekError, and returns it. */
export function peekError(body: string | Uint8Array): RequestPeekError {
  try {
    peekRequest(typeof body === 'string' ? bytes(body) : body);
  } catch (error) {
    if (error instanceof RequestPeekError) return error;
    throw error;
  }
  throw new Error(`expected a RequestPeekError for ${JSON.stringify(String(body)).slice(0, 200)}`);
}

/** What peekRequest must do with a body, worked out from JSON.parse alone. */
export type Expected =
  | { readonly kind: 'json' }
  | { readonly kind: 'field'; readonly field: string }
  | {
      readonly kind: 'ok';
      readonly parsed: Record<string, unknown>;
      readonly model: string | undefined;
      readonly stream: boolean | undefined;
      readonly maxTokens: number | undefined;
      readonly maxCompletionTokens: number | undefined;
      readonly minTokens: number | undefined;
      readonly echo: boolean | undefined;
      readonly promptLogprobs: boolean;
      readonly returnTokenIds: boolean | undefined;
      readonly returnPromptText: boolean | undefined;
      readonly truncatePromptTokens: boolean;
      readonly n: number | undefined;
      readonly prompts: number;
    };

/** Rust's `str::trim` whitespace (Unicode White_Space), at either end of a string. */
const WS_EDGES =
  /^[\t-\r \u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]+|[\t-\r \u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]+$/g;
const JSON_INT = /^-?(0|[1-9][0-9]*)$/;

/**
 * What pydantic's lax `int` makes of a JSON value, written out from pydantic-core's
 * `str_as_int` / `clean_int_str` (src/input/shared.rs) step by step with regular expressions,
 * apart from the code under test; test/lax.test.ts checks it against what pydantic answered.
 * Undefined for null or absent, 'bad' for what pydantic refuses.
 */
export function pydanticInt(value: unknown): number | undefined | 'bad' {
  if (value === undefined || value === null) return undefined;
  if (typeof value === 'boolean') return value ? 1 : 0;
  if (typeof value === 'number') return Number.isInteger(value) ? value + 0 : 'bad';
  if (typeof value !== 'string') return 'bad';
  if (JSON_INT.test(value)) return Number(value) + 0;
  let s = value.replace(WS_EDGES, '');
  // one '+' not followed by '-', then one '-' not followed by a sign
  const sign = /^(?:\+(?!-))?(-(?![-+]))?/.exec(s)!;
  s = s.slice(sign[0].length);
  const zeros = /^0[0_]*/.exec(s);
  if (zeros !== null) {
    const rest = s.slice(zeros[0].length);
    if (rest === '') s = s.slice(-1);
    else if (/^[1-9-]/.test(rest)) s = rest;
    else if (rest.startsWith('.')) s = s.slice(zeros[0].length - 1);
    else return 'bad';
  } else if (!/^[1-9-]/.test(s)) {
    return 'bad';
  }
  s = s.replace(/^([^.]*)\.0+$/, '$1');
  if (s.includes('_') && !/^_|_$|__/.test(s)) s = s.replace(/_/g, '');
  const out = (sign[1] ?? '') + s;
  return JSON_INT.test(out) ? Number(out) + 0 : 'bad';
}

/** What pydantic's lax `bool` makes of a JSON value (`str_as_bool`, `int_as_bool`). */
export function pydanticBool(value: unknown): boolean | undefined | 'bad' {
  if (value === undefined || value === null) return undefined;
  if (typeof value === 'boolean') return value;
  if (value === 0 || value === 1) return value === 1;
  if (value === '0' || value === '1') return value === '1';
  if (typeof value !== 'string' || /[\u0080-\uffff]/.test(value)) return 'bad';
  const word = value.toLowerCase();
  if (['t', 'y', 'on', 'yes', 'true'].includes(word)) return true;
  if (['f', 'n', 'no', 'off', 'false'].includes(word)) return false;
  return 'bad';
}

/** A flag that only decides whether the prompt may be touched: any value but false is on. */
export function promptFlag(value: unknown): boolean | undefined {
  const v = pydanticBool(value);
  return v === undefined ? undefined : v !== false;
}

function tokenCount(value: unknown, min = 0): number | undefined | 'bad' {
  const v = pydanticInt(value);
  if (v === undefined) return undefined;
  return v !== 'bad' && Number.isSafeInteger(v) && v >= min ? v : 'bad';
}

/** The oracle: JSON.parse of the body's text, then the documented field rules. */
export function expectedFor(body: Uint8Array): Expected {
  // JSON.parse never sees bytes: invalid UTF-8 is a JSON error before it is decoded away.
  if (!isUtf8(body)) return { kind: 'json' };
  let value: unknown;
  try {
    value = JSON.parse(Buffer.from(body.buffer, body.byteOffset, body.length).toString('utf8'));
  } catch {
    return { kind: 'json' };
  }
  if (value === null || typeof value !== 'object' || Array.isArray(value)) return { kind: 'json' };
  const parsed = value as Record<string, unknown>;
  const get = (key: string): unknown => (Object.hasOwn(parsed, key) ? parsed[key] : undefined);
  // Optional, as vLLM's `model: str | None = None`: absent or null is no model.
  const model = get('model');
  if (model !== undefined && model !== null && typeof model !== 'string')
    return { kind: 'field', field: 'model' };
  const stream = pydanticBool(get('stream'));
  if (stream === 'bad') return { kind: 'field', field: 'stream' };
  const maxTokens = tokenCount(get('max_tokens'));
  if (maxTokens === 'bad') return { kind: 'field', field: 'max_tokens' };
  const maxCompletionTokens = tokenCount(get('max_completion_tokens'));
  if (maxCompletionTokens === 'bad') return { kind: 'field', field: 'max_completion_tokens' };
  const minTokens = tokenCount(get('min_tokens'));
  if (minTokens === 'bad') return { kind: 'field', field: 'min_tokens' };
  // The prompt flags are never refused: what pydantic reads as false is false, null or
  // absent undefined, anything else true.
  const echo = promptFlag(get('echo'));
  const set = (key: string) => get(key) !== undefined && get(key) !== null;
  const messages = get('messages');
  if (messages !== undefined && messages !== null && !Array.isArray(messages)) {
    return { kind: 'field', field: 'messages' };
  }
  const n = tokenCount(get('n'), 1);
  if (n === 'bad') return { kind: 'field', field: 'n' };
  const priority = pydanticInt(get('priority'));
  if (priority !== undefined && priority !== 0) return { kind: 'field', field: 'priority' };
  // Prompts of a batch: an array whose first element is not a number (token ids are one).
  const prompt = get('prompt');
  const prompts =
    Array.isArray(prompt) && prompt.length > 0 && typeof prompt[0] !== 'number' ? prompt.length : 1;
  return {
    kind: 'ok',
    parsed,
    model: model ?? undefined,
    stream,
    maxTokens,
    maxCompletionTokens,
    minTokens,
    echo,
    promptLogprobs: set('prompt_logprobs'),
    returnTokenIds: promptFlag(get('return_token_ids')),
    returnPromptText: promptFlag(get('return_prompt_text')),
    truncatePromptTokens: set('truncate_prompt_tokens'),
    n,
    prompts,
  };
}

const slice = (body: Uint8Array, span: { start: number; end: number }): unknown =>
  JSON.parse(Buffer.from(body.subarray(span.start, span.end)).toString('utf8'));

function checkSpan(
  body: Uint8Array,
  parsed: Record<string, unknown>,
  key: string,
  span: { start: number; end: number } | undefined,
  nullIsAbsent: boolean,
): void {
  const present = Object.hasOwn(parsed, key) && !(nullIsAbsent && parsed[key] === null);
  if (!present) {
    expect(span).toBeUndefined();
    return;
  }
  expect(span).toBeDefined();
  expect(slice(body, span!)).toStrictEqual(parsed[key]);
}

/**
 * Runs peekRequest on `body` and checks it against the oracle: the same outcome, the same
 * values, and spans that slice to the values JSON.parse found.
 */
export function checkAgainstOracle(body: Uint8Array): PeekedRequest | RequestPeekError {
  const expected = expectedFor(body);
  let result: PeekedRequest;
  try {
    result = peekRequest(body);
  } catch (error) {
    if (!(error instanceof RequestPeekError)) throw error;
    expect(expected.kind).not.toBe('ok');
    if (expected.kind === 'json') expect(error.code).toBe('ERR_JSON');
    if (expected.kind === 'field') {
      expect(error.code).toBe('ERR_FIELD');
      expect(error.field).toBe(expected.field);
    }
    return error;
  }
  expect(expected.kind).toBe('ok');
  if (expected.kind !== 'ok') return result;
  const { parsed } = expected;
  expect(result.model).toBe(expected.model);
  expect(result.stream).toBe(expected.stream);
  expect(result.maxTokens).toBe(expected.maxTokens);
  expect(result.maxCompletionTokens).toBe(expected.maxCompletionTokens);
  expect(result.minTokens).toBe(expected.minTokens);
  expect(result.echo).toBe(expected.echo);
  expect(result.promptLogprobs).toBe(expected.promptLogprobs);
  expect(result.returnTokenIds).toBe(expected.returnTokenIds);
  expect(result.returnPromptText).toBe(expected.returnPromptText);
  expect(result.truncatePromptTokens).toBe(expected.truncatePromptTokens);
  expect(result.n).toBe(expected.n);
  expect(result.prompts).toBe(expected.prompts);
  checkSpan(body, parsed, 'messages', result.messages, true);
  checkSpan(body, parsed, 'prompt', result.prompt, true);
  checkSpan(body, parsed, 'tools', result.tools, true);
  checkSpan(body, parsed, 'documents', result.documents, true);
  checkSpan(body, parsed, 'chat_template', result.chatTemplate, true);
  checkSpan(body, parsed, 'chat_template_kwargs', result.chatTemplateKwargs, true);
  checkSpan(body, parsed, 'model', result.modelSpan, false);
  checkSpan(body, parsed, 'stream', result.streamSpan, false);
  checkSpan(body, parsed, 'max_tokens', result.maxTokensSpan, false);
  checkSpan(body, parsed, 'max_completion_tokens', result.maxCompletionTokensSpan, false);
  expect(body[result.objectStart]).toBe(0x7b);
  expect(body[result.objectEnd]).toBe(0x7d);
  const outside = (from: number, to: number) =>
    Buffer.from(body.subarray(from, to)).toString('latin1');
  expect(outside(0, result.objectStart)).toMatch(/^[ \t\r\n]*$/);
  expect(outside(result.objectEnd + 1, body.length)).toMatch(/^[ \t\r\n]*$/);
  return result;
}
