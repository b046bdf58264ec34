/** Byte offsets into the request body: `start` at the first byte, `end` one past the last. */
export interface ByteSpan {
  readonly start: number;
  readonly end: number;
}

/**
 * The top-level fields Sluice needs from an OpenAI chat/completions request, and where their
 * values sit in the body so a rewrite can splice bytes instead of re-serialising. Every
 * property is always present (undefined when absent); `null` counts as absent for every
 * field but `model`.
 */
export interface PeekedRequest {
  /** `model`, unescaped. */
  readonly model: string;
  /** `stream`; undefined when absent or null. */
  readonly stream: boolean | undefined;
  /** `max_tokens`; undefined when absent or null. */
  readonly maxTokens: number | undefined;
  /** `max_completion_tokens`; undefined when absent or null. */
  readonly maxCompletionTokens: number | undefined;
  /**
   * `min_tokens` (a vLLM extra on both endpoints); undefined when absent or null. Read so that
   * a degraded limit is never scaled below it: vLLM refuses `min_tokens > max_tokens`.
   */
  readonly minTokens: number | undefined;
  /**
   * `echo`: false for `false`, true for any other value (vLLM's pydantic reads `1`, `"yes"`,
   * `"true"` … as true, and a prompt that may be echoed must not be prefixed); undefined when
   * absent or null.
   */
  readonly echo: boolean | undefined;
  /** `n`, choices per prompt (a positive integer); undefined when absent or null. */
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
  /** The `model` value, quotes included. */
  readonly modelSpan: ByteSpan;
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
