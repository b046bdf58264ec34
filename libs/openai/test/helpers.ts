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
      readonly model: string;
      readonly stream: boolean | undefined;
      readonly maxTokens: number | undefined;
      readonly maxCompletionTokens: number | undefined;
      readonly minTokens: number | undefined;
      readonly echo: boolean | undefined;
      readonly n: number | undefined;
      readonly prompts: number;
    };

function tokenCount(value: unknown): number | undefined | 'bad' {
  if (value === undefined || value === null) return undefined;
  if (typeof value === 'number' && Number.isSafeInteger(value) && value >= 0) return value + 0;
  return 'bad';
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
  if (typeof get('model') !== 'string') return { kind: 'field', field: 'model' };
  const stream = get('stream');
  if (stream !== undefined && stream !== null && typeof stream !== 'boolean') {
    return { kind: 'field', field: 'stream' };
  }
  const maxTokens = tokenCount(get('max_tokens'));
  if (maxTokens === 'bad') return { kind: 'field', field: 'max_tokens' };
  const maxCompletionTokens = tokenCount(get('max_completion_tokens'));
  if (maxCompletionTokens === 'bad') return { kind: 'field', field: 'max_completion_tokens' };
  const minTokens = tokenCount(get('min_tokens'));
  if (minTokens === 'bad') return { kind: 'field', field: 'min_tokens' };
  // echo is never refused: false is false, null or absent undefined, anything else true.
  const echoValue = get('echo');
  const echo = echoValue === undefined || echoValue === null ? undefined : echoValue !== false;
  const messages = get('messages');
  if (messages !== undefined && messages !== null && !Array.isArray(messages)) {
    return { kind: 'field', field: 'messages' };
  }
  const n = tokenCount(get('n'));
  if (n === 'bad' || n === 0) return { kind: 'field', field: 'n' };
  const priority = get('priority');
  if (priority !== undefined && priority !== null && priority !== 0)
    return { kind: 'field', field: 'priority' };
  // Prompts of a batch: an array whose first element is not a number (token ids are one).
  const prompt = get('prompt');
  const prompts =
    Array.isArray(prompt) && prompt.length > 0 && typeof prompt[0] !== 'number' ? prompt.length : 1;
  return {
    kind: 'ok',
    parsed,
    model: get('model') as string,
    stream: (stream ?? undefined) as boolean | undefined,
    maxTokens,
    maxCompletionTokens,
    minTokens,
    echo,
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
