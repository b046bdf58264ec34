import { Buffer } from 'node:buffer';
import { expect } from 'vitest';
import type { PeekedRequest, RewritePlan } from '../src/index.js';
import { promptFlag, pydanticInt } from './helpers.js';

/** A plan with everything off; tests switch on what they need. */
export const basePlan: RewritePlan = {
  endpoint: 'chat',
  instruction: undefined,
  systemPrompt: 'prepend',
  completionPrefix: false,
  maxTokensFactor: 1,
  minMaxTokens: 16,
  defaultMaxTokens: 1000,
};

/** vLLM's CompletionRequest default for an absent max_tokens (vllm/.../completion/protocol.py). */
export const COMPLETION_DEFAULT = 16;

/**
 * The limit a field gets, written out from the plan's rules (not from the code under test):
 * `original` is the limit vLLM would apply (a limit left to the context window is never set);
 * `minTokens` the request's min_tokens (0 when none).
 */
export function expectedLimit(original: number, plan: RewritePlan, minTokens = 0): number {
  const f = plan.maxTokensFactor;
  return Math.min(original, Math.max(plan.minMaxTokens, minTokens, Math.round(original * f)));
}

/** Keys whose last value, when not null, may constrain vLLM's output to a grammar. */
export const GUIDED_KEYS = [
  'guided_json',
  'guided_regex',
  'guided_choice',
  'guided_grammar',
  'structured_outputs',
] as const;

/**
 * Whether a parsed request constrains its output: tool_choice other than auto / none,
 * response_format other than {"type":"text"}, or any guided_* / structured_outputs (null is
 * as absent throughout); on chat, also a non-empty `tools` array unless tool_choice is
 * "none" (vLLM defaults tool_choice to "auto" when tools come without it).
 */
export function constrainsOutput(
  value: Record<string, unknown>,
  endpoint: 'chat' | 'completion',
): boolean {
  const set = (key: string) => value[key] !== undefined && value[key] !== null;
  if (GUIDED_KEYS.some(set)) return true;
  const format = value.response_format;
  if (set('response_format') && !(isObject(format) && format.type === 'text')) return true;
  const choice = value.tool_choice;
  if (set('tool_choice') && choice !== 'auto' && choice !== 'none') return true;
  const tools = value.tools;
  return endpoint === 'chat' && Array.isArray(tools) && tools.length > 0 && choice !== 'none';
}

/**
 * Whether vLLM returns or truncates the prompt of a parsed request, so that it gets no
 * instruction: echo, return_token_ids (and, on chat, return_prompt_text) not false as pydantic
 * reads a bool; prompt_logprobs or truncate_prompt_tokens set to anything but null.
 */
export function promptMustStay(
  value: Record<string, unknown>,
  endpoint: 'chat' | 'completion',
): boolean {
  const set = (key: string) => value[key] !== undefined && value[key] !== null;
  return (
    promptFlag(value.echo) === true ||
    promptFlag(value.return_token_ids) === true ||
    (endpoint === 'chat' && promptFlag(value.return_prompt_text) === true) ||
    set('prompt_logprobs') ||
    set('truncate_prompt_tokens')
  );
}

/** A limit as vLLM's pydantic reads it; undefined when absent or null (the peek refused others). */
export function limitOf(value: Record<string, unknown>, key: string): number | undefined {
  const v = pydanticInt(value[key]);
  return v === 'bad' ? undefined : v;
}

/**
 * The max_tokens vLLM applies to a parsed request before its context-window cap: chat reads
 * max_completion_tokens, else max_tokens, else runs to the end of the context (Infinity here);
 * completions read max_tokens only, 16 when the key is absent, the end of the context when
 * it is null (vllm/entrypoints/openai/*, vllm/entrypoints/utils.py get_max_tokens).
 */
export function vllmLimit(value: Record<string, unknown>, endpoint: 'chat' | 'completion'): number {
  const limit = (key: string): number | undefined => limitOf(value, key);
  if (endpoint === 'chat') {
    return limit('max_completion_tokens') ?? limit('max_tokens') ?? Infinity;
  }
  if (!Object.hasOwn(value, 'max_tokens')) return COMPLETION_DEFAULT;
  return limit('max_tokens') ?? Infinity;
}

const isObject = (v: unknown): v is Record<string, unknown> =>
  v !== null && typeof v === 'object' && !Array.isArray(v);

/** Where the edit goes in the original body: an exact offset, or anywhere in [from, to]. */
export interface ExpectedEdit {
  readonly from: number;
  readonly to: number;
  /** Bytes of the original replaced, from the chosen offset (0: an insert). */
  readonly removes: number;
  readonly bytes: Buffer;
}

/**
 * The message that takes the instruction, and how: messages[0] when it is a system message
 * (in the plan's mode), else the first user message (always in front). Undefined when there
 * is none.
 */
export function instructionTarget(
  messages: unknown[],
  mode: 'prepend' | 'append',
): { message: Record<string, unknown>; mode: 'prepend' | 'append' } | undefined {
  const first = messages[0];
  if (isObject(first) && first.role === 'system') return { message: first, mode };
  const user = messages.find((m) => isObject(m) && m.role === 'user');
  return user === undefined
    ? undefined
    : { message: user as Record<string, unknown>, mode: 'prepend' };
}

/**
 * The text an instruction joins in a message: its string content, or the text of its
 * content's first part when that part is a text part.
 */
function joinable(
  message: Record<string, unknown>,
): { text: string; set(value: string): void } | undefined {
  const content = message.content;
  if (typeof content === 'string')
    return { text: content, set: (value) => (message.content = value) };
  const part: unknown = Array.isArray(content) ? content[0] : undefined;
  if (
    isObject(part) &&
    typeof part.text === 'string' &&
    (!('type' in part) || part.type === 'text')
  )
    return { text: part.text, set: (value) => (part.text = value) };
  return undefined;
}

/**
 * What a rewrite must give, worked out from JSON.parse and object edits alone: the parsed
 * result, and the splices (from the peek's spans) that must turn the body into the output.
 */

export function expectedRewrite(
  body: Buffer,
  peeked: PeekedRequest,
  plan: RewritePlan,
): { value: Record<string, unknown>; edits: ExpectedEdit[] } {
  const value = JSON.parse(body.toString('utf8')) as Record<string, unknown>;
  const edits: ExpectedEdit[] = [];
  const at = (offset: number, text: string, removes = 0): void => {
    edits.push({ from: offset, to: offset, removes, bytes: Buffer.from(text) });
  };
  const esc = (text: string) => JSON.stringify(text).slice(1, -1);
  const instruction = plan.instruction;
  if (instruction !== undefined && instruction !== '' && !promptMustStay(value, plan.endpoint)) {
    const messages = value.messages;
    const target = Array.isArray(messages)
      ? instructionTarget(messages, plan.systemPrompt)
      : undefined;
    if (plan.endpoint === 'chat' && target !== undefined) {
      // Somewhere inside the messages array: the exact offset is the scan's to find.
      const span = peeked.messages!;
      const inside = (text: string, removes = 0): void => {
        edits.push({ from: span.start + 1, to: span.end - 1, removes, bytes: Buffer.from(text) });
      };
      const { message, mode } = target;
      const content = message.content;
      const join = joinable(message);
      if (join) {
        join.set(
          mode === 'prepend' ? `${instruction}\n\n${join.text}` : `${join.text}\n\n${instruction}`,
        );
        inside(esc(mode === 'prepend' ? `${instruction}\n\n` : `\n\n${instruction}`));
      } else if (Array.isArray(content)) {
        content.unshift({ type: 'text', text: instruction });
        const comma = content.length > 1 ? ',' : '';
        inside(`{"type":"text","text":${JSON.stringify(instruction)}}${comma}`);
      } else if (content === null) {
        message.content = instruction;
        inside(JSON.stringify(instruction), 'null'.length);
      }
    }
    const prompt = value.prompt;
    if (plan.endpoint === 'completion' && plan.completionPrefix) {
      if (typeof prompt === 'string') {
        value.prompt = `${instruction}\n\n${prompt}`;
        at(peeked.prompt!.start + 1, esc(`${instruction}\n\n`));
      } else if (Array.isArray(prompt) && prompt.length === 1 && typeof prompt[0] === 'string') {
        prompt[0] = `${instruction}\n\n${prompt[0]}`;
        let q = peeked.prompt!.start + 1;
        while (body[q] !== 0x22) q++;
        at(q + 1, esc(`${instruction}\n\n`));
      }
    }
  }
  // A request that constrains its output keeps its limits.
  if (plan.maxTokensFactor !== 1 && !constrainsOutput(value, plan.endpoint)) {
    const minTokens = limitOf(value, 'min_tokens') ?? 0;
    // Every limit sent is scaled, on either endpoint; one sent as a string or a boolean is
    // written back as a number.
    for (const [key, span] of [
      ['max_tokens', peeked.maxTokensSpan],
      ['max_completion_tokens', peeked.maxCompletionTokensSpan],
    ] as const) {
      const original = limitOf(value, key);
      if (original === undefined) continue;
      const limit = expectedLimit(original, plan, minTokens);
      if (limit === original) continue;
      value[key] = limit;
      at(span!.start, String(limit), span!.end - span!.start);
    }
    // Then max_tokens is set only where vLLM's own limit is known and larger: completions
    // without the key (16). The end of the context (chat without a limit, completions with
    // null) is never replaced by a limit, which vLLM could refuse for a long prompt.
    if (plan.endpoint === 'completion' && !Object.hasOwn(value, 'max_tokens')) {
      const limit = expectedLimit(COMPLETION_DEFAULT, plan, minTokens);
      if (limit !== COMPLETION_DEFAULT) {
        let last = peeked.objectEnd - 1;
        while (' \t\r\n'.includes(String.fromCharCode(body[last]!))) last--;
        at(last + 1, `${last === peeked.objectStart ? '' : ','}"max_tokens":${limit}`);
        value.max_tokens = limit;
      }
    }
  }
  edits.sort((x, y) => x.from - y.from);
  return { value, edits };
}

/**
 * Checks that `out` is `body` with exactly `edits` spliced in: every segment between the edits
 * is byte-identical to the body's. An edit with a range of offsets must fit at one of them.
 */
export function expectSpliced(body: Buffer, out: Buffer, edits: readonly ExpectedEdit[]): void {
  let a = 0; // where the next untouched segment starts in the body
  let o = 0; // and in the output
  const same = (bodyFrom: number, bodyTo: number, outFrom: number) =>
    bodyTo >= bodyFrom &&
    outFrom + (bodyTo - bodyFrom) <= out.length &&
    body.subarray(bodyFrom, bodyTo).equals(out.subarray(outFrom, outFrom + (bodyTo - bodyFrom)));
  edits.forEach((e, k) => {
    const next = k + 1 < edits.length ? edits[k + 1]!.from : body.length;
    let placed = -1;
    // The edit starts at or before the first byte where body and output part: no later offset
    // can have the untouched bytes before it line up.
    let common = 0;
    while (a + common < body.length && body[a + common] === out[o + common]) common++;
    const to = Math.min(e.to, a + common);
    for (let p = e.from; p <= to && placed < 0; p++) {
      const shifted = o + (p - a);
      if (
        out.subarray(shifted, shifted + e.bytes.length).equals(e.bytes) &&
        // the rest up to the next edit must line up too, or this offset is not the one
        same(p + e.removes, Math.max(p + e.removes, next), shifted + e.bytes.length)
      ) {
        placed = p;
      }
    }
    if (placed < 0) {
      throw new Error(`edit ${k} (${e.bytes.toString()}) does not fit ${out.toString()}`);
    }
    o += placed - a + e.bytes.length;
    a = placed + e.removes;
  });
  expect(same(a, body.length, o)).toBe(true);
  expect(o + (body.length - a)).toBe(out.length);
}
