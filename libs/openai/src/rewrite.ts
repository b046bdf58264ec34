// The release-time rewrite: degrade a request (add an instruction, scale its token limit) by
// splicing bytes into the raw body at the spans peekRequest found, never by parsing and
// re-serialising it. Every byte outside the edited spots is copied as it is, once. This module
// is the entry point: it checks the plan and the peek, decides which edits a request gets and
// applies them. Where the peek does not say enough, the body is scanned as raw bytes and without
// building values: the messages up to the one that takes the instruction
// (rewrite-instruction.ts), and the top-level keys (the peek's spans stepped over) only when a
// token limit would change (rewrite-limits.ts).

import { Buffer } from 'node:buffer';
import { splice } from './rewrite-edit.js';
import type { Edit } from './rewrite-edit.js';
import { encoded, instructMessages, prefixPrompt } from './rewrite-instruction.js';
import { constrainsOutput, limitEdits } from './rewrite-limits.js';
import { checkPlan } from './rewrite-plan.js';
import type { RewritePlan } from './rewrite-plan.js';
import { bindWords, releaseWords } from './scan.js';
import type { ByteSpan, PeekedRequest } from './types.js';

export { plannedMaxTokens, VLLM_COMPLETION_MAX_TOKENS } from './rewrite-limits.js';
export type { RewritePlan } from './rewrite-plan.js';

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
