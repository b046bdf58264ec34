// What a rewrite is asked to do (RewritePlan), and the check every entry point makes of a plan.
// A module of its own so that rewrite-limits.ts can read the plan without importing the entry
// point (rewrite.ts), which imports it.

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

export function checkPlan(plan: RewritePlan): void {
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
