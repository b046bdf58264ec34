// The token limits: what the rewrite sets a limit to (plannedMaxTokens), the edits that scale
// those the client sent or vLLM defaults, and whether the request constrains its output, in
// which case it keeps them. That check scans the top-level keys as raw bytes, stepping over
// the values the peek found by their spans.

import { decodeString } from './decode.js';
import type { Edit } from './rewrite-edit.js';
import { utf8 } from './rewrite-edit.js';
import { eachMember, partKey, skipOther } from './rewrite-members.js';
import { checkPlan } from './rewrite-plan.js';
import type { RewritePlan } from './rewrite-plan.js';
import { lastStringEscaped, scanString, skipWhitespace } from './scan.js';
import type { ByteSpan, PeekedRequest } from './types.js';

/**
 * What vLLM generates for a completions request without a `max_tokens` key: its
 * `CompletionRequest` declares `max_tokens: int | None = 16`
 * (vllm/entrypoints/openai/completion/protocol.py; vllm/entrypoints/openai/protocol.py before
 * the split). An explicit null is not this default: it reaches `get_max_tokens`
 * (vllm/entrypoints/utils.py) as None, which leaves the rest of the context window.
 */
export const VLLM_COMPLETION_MAX_TOKENS = 16;

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

// --- token limits: the edits ----------------------------------------------------------------

/** The edits that scale the token limits, before the check for a constrained output. */
export function limitEdits(b: Uint8Array, p: PeekedRequest, plan: RewritePlan): Edit[] {
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
export function constrainsOutput(
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
