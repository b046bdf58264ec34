/** Byte offsets into the request body: `start` at the first byte, `end` one past the last. */
export interface ByteSpan {
  readonly start: number;
  readonly end: number;
}

/**
 * The top-level fields Sluice needs from an OpenAI chat/completions request, and where their
 * values sit in the body so a rewrite can splice bytes instead of re-serialising. Every
 * property is always present (undefined when absent, false for the two flags that are plain
 * booleans); `null` counts as absent for every field. Numbers and booleans are
 * read as vLLM's pydantic reads them in lax mode (see lax.ts): `"max_tokens":"100"` is 100,
 * `"stream":"true"` is true.
 */
export interface PeekedRequest {
  /**
   * `model`, unescaped; undefined when absent or null. vLLM's `model` is optional: it serves a
   * request without one (or with null or "") with its first served model.
   */
  readonly model: string | undefined;
  /**
   * `stream` (true, false, 0, 1, or a string pydantic reads as a bool: "true", "no" …);
   * undefined when absent or null.
   */
  readonly stream: boolean | undefined;
  /**
   * `max_tokens` (a number without a fraction, true / false as 1 / 0, or a string of an
   * integer: "100", " 100 ", "1_000"); undefined when absent or null.
   */
  readonly maxTokens: number | undefined;
  /** `max_completion_tokens`, read as `maxTokens`; undefined when absent or null. */
  readonly maxCompletionTokens: number | undefined;
  /**
   * `min_tokens` (a vLLM extra on both endpoints); undefined when absent or null. Read so that
   * a degraded limit is never scaled below it: vLLM refuses `min_tokens > max_tokens`.
   */
  readonly minTokens: number | undefined;
  /**
   * `echo`, as vLLM's pydantic reads a bool: false for false, 0, and "0", "f", "n", "no",
   * "off", "false" in any case; true for true, 1, "yes" … and for any value pydantic refuses
   * (vLLM answers 400 to those, and a prompt that may be echoed must not be touched); undefined
   * when absent or null. With it vLLM sends the prompt back: completions ahead of the answer,
   * chat the last message when it is the answer's role, and both the prompt's logprobs.
   */
  readonly echo: boolean | undefined;
  /**
   * Whether `prompt_logprobs` is set (any value but null; 0 is set: it scores every prompt
   * token). vLLM returns the logprobs of the prompt as it tokenized it, on both endpoints.
   */
  readonly promptLogprobs: boolean;
  /**
   * vLLM's `return_token_ids`, read as `echo`: with it the response carries
   * `prompt_token_ids`, the prompt as the engine got it. Undefined when absent or null.
   */
  readonly returnTokenIds: boolean | undefined;
  /**
   * vLLM's `return_prompt_text` (chat only; completions ignore it), read as `echo`: with it
   * the response carries `prompt_text`, the rendered chat prompt. Undefined when absent or
   * null.
   */
  readonly returnPromptText: boolean | undefined;
  /**
   * Whether vLLM's `truncate_prompt_tokens` is set (any value but null): the prompt is cut to
   * that many tokens, from the left by default, so anything added to it changes what of the
   * client's prompt is kept.
   */
  readonly truncatePromptTokens: boolean;
  /** `n`, choices per prompt (a positive integer, read as `maxTokens`); undefined when absent or null. */
  readonly n: number | undefined;
  /**
   * Prompts in `prompt`: the elements of a batch (an array of strings or of token-id arrays),
   * else 1. See `engineRequests`.
   */
  readonly prompts: number;
  /** The `messages` array, '[' to one past ']'; undefined when absent or null. */
  readonly messages: ByteSpan | undefined;
  /** The `prompt` value, whatever its type; undefined when absent or null. */
  readonly prompt: ByteSpan | undefined;
  /**
   * The `tools` value, whatever its type; undefined when absent or null. Not checked: the
   * engine refuses a bad one, and Sluice only counts it, since chat templates write the tool
   * definitions into the prompt.
   */
  readonly tools: ByteSpan | undefined;
  /**
   * vLLM's `documents` (RAG: a chat template that supports them writes them into the prompt;
   * `ChatCompletionRequest` in vllm/entrypoints/openai/protocol.py), whatever its type;
   * undefined when absent or null. As `tools`. OpenAI's legacy `functions` is not read: vLLM
   * has no such field and ignores it, so it never reaches the prompt.
   */
  readonly documents: ByteSpan | undefined;
  /**
   * vLLM's per-request `chat_template` (a Jinja template: its literal text reaches the prompt),
   * whatever its type; undefined when absent or null.
   */
  readonly chatTemplate: ByteSpan | undefined;
  /**
   * vLLM's `chat_template_kwargs`, whatever its type; undefined when absent or null. vLLM merges
   * it over the template's own arguments, `tools` and `documents` included
   * (vllm/entrypoints/openai/serving_engine.py `_preprocess_chat`), so what it carries can reach
   * the prompt as those do.
   */
  readonly chatTemplateKwargs: ByteSpan | undefined;
  /** The `model` value, quotes included; present whenever the key is (null included). */
  readonly modelSpan: ByteSpan | undefined;
  /** The `stream` value, present whenever the key is (null included). */
  readonly streamSpan: ByteSpan | undefined;
  /** The `max_tokens` value, present whenever the key is (null included). */
  readonly maxTokensSpan: ByteSpan | undefined;
  /** The `max_completion_tokens` value, present whenever the key is (null included). */
  readonly maxCompletionTokensSpan: ByteSpan | undefined;
  /** Offset of the top-level '{'. */
  readonly objectStart: number;
  /** Offset of the top-level closing '}'. */
  readonly objectEnd: number;
}
