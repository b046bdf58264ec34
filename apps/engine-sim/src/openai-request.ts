// Validates an OpenAI request the way vLLM's server does where it matters here, and
// reduces it to what the engine needs: prompt lengths, output length, stream flags, and the
// engine sequences it fans out into.
import { countTokens, hash32 } from './text.js';

export type Endpoint = 'chat' | 'completion';

/**
 * One engine sequence of a request: a (prompt, choice) pair. vLLM V1 runs each as its own
 * request in the scheduler: serving_completion.py starts one generator per prompt of a batch
 * ("for i, engine_prompt in enumerate(engine_prompts): ... generators.append(generator)"),
 * and vllm/v1/engine/async_llm.py `add_request` fans each out into `n` children ("# Fan out
 * child requests (for n>1). ... for idx in range(parent_params.n): ... await
 * self._add_request(child_request, ...)"), each with its own KV blocks and counted in
 * `vllm:num_requests_running` / `_waiting`.
 */
export interface SimChoice {
  /**
   * `choices[i].index`: `prompt_idx * n + choice_idx`. serving_completion.py, streaming: "i =
   * output.index + prompt_idx * num_choices"; not streaming: "index=len(choices)" over the
   * prompts in order and each prompt's outputs in index order. Chat has one prompt: the index
   * is the choice index ("index=output.index", serving_chat.py).
   */
  index: number;
  promptIndex: number;
  choiceIndex: number;
  promptTokens: number;
  /** The prompt as text (messages as JSON), the content the prefix cache hashes. */
  promptText: string;
  /** Seed of the output words: prompt, model, `seed` and the choice index, never the stream flags. */
  seed: number;
}

export interface SimRequest {
  endpoint: Endpoint;
  model: string;
  stream: boolean;
  includeUsage: boolean;
  /** vLLM's `n`: choices per prompt. */
  n: number;
  /** The engine sequences, in `index` order: every prompt's `n` choices, prompt by prompt. */
  choices: SimChoice[];
  /** Prompts in the request: 1 for chat, the batch size for /v1/completions. */
  numPrompts: number;
  /**
   * `usage.prompt_tokens`: each prompt once, however many choices it has (serving_chat.py
   * "num_prompt_tokens = len(final_res.prompt_token_ids)"; serving_completion.py adds
   * "len(prompt_token_ids)" once per prompt of the batch, streaming "sum(num_prompt_tokens)").
   */
  promptTokens: number;
  /** `max_tokens` / `max_completion_tokens`, or undefined for "up to the context". */
  maxTokens: number | undefined;
  ignoreEos: boolean;
  /** Seed of the response id: the choice's seed for one sequence, else all prompts and `n`. */
  seed: number;
  /** The prompt as read (one prompt: its text; a batch: the JSON array of its prompts' texts). */
  promptText: string;
  /** vLLM's `priority` request field (default 0; lower is served first under `priority`). */
  priority: number;
  /**
   * vLLM's `cache_salt` (chat completions and completions): mixed into the hash of each prompt's
   * first block (prefix-hash.ts), so only requests with the same salt share cached blocks.
   * Undefined when absent or null.
   */
  cacheSalt: string | undefined;
}

export class SimRequestError extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly param: string | null = null,
  ) {
    super(message);
  }

  get type(): string {
    return this.status === 404 ? 'NotFoundError' : 'BadRequestError';
  }
}

type Json = Record<string, unknown>;

const isObject = (v: unknown): v is Json =>
  typeof v === 'object' && v !== null && !Array.isArray(v);

function optionalPositiveInt(body: Json, field: string): number | undefined {
  const value = body[field];
  if (value === undefined || value === null) return undefined;
  if (typeof value !== 'number' || !Number.isInteger(value) || value < 1)
    throw new SimRequestError(
      400,
      `${field} must be a positive integer, got ${JSON.stringify(value)}`,
      field,
    );
  return value;
}

/**
 * vLLM's `cache_salt`: absent or null is none; anything else must be a non-empty string
 * ("Parameter 'cache_salt' must be a non-empty string if provided.", `check_cache_salt_support`
 * on ChatCompletionRequest and CompletionRequest, vllm/entrypoints/openai/protocol.py; later
 * `validate_cache_salt`, vllm/entrypoints/generate/base/protocol.py). The simulator is a V1
 * engine, so it never answers V0's "not supported with this instance of vLLM, which uses engine
 * V0." A duplicate key is JSON.parse's last, as Python's json keeps the last.
 */
function cacheSaltOf(body: Json): string | undefined {
  const value = body['cache_salt'];
  if (value === undefined || value === null) return undefined;
  if (typeof value !== 'string' || value === '')
    throw new SimRequestError(
      400,
      "Parameter 'cache_salt' must be a non-empty string if provided.",
      'cache_salt',
    );
  return value;
}

function optionalBoolean(body: Json, field: string): boolean {
  const value = body[field];
  if (value === undefined || value === null) return false;
  if (typeof value !== 'boolean')
    throw new SimRequestError(400, `${field} must be a boolean`, field);
  return value;
}

/** Characters of chat content: a string, or an array of `{type: "text", text}` parts. */
function contentLength(content: unknown, index: number): number {
  if (typeof content === 'string') return content.length;
  if (content === null || content === undefined) return 0;
  if (Array.isArray(content)) {
    let n = 0;
    for (const part of content) {
      if (!isObject(part) || typeof part['text'] !== 'string')
        throw new SimRequestError(
          400,
          `messages[${index}].content parts must be text parts`,
          'messages',
        );
      n += part['text'].length;
    }
    return n;
  }
  throw new SimRequestError(
    400,
    `messages[${index}].content must be a string or an array of parts`,
    'messages',
  );
}

interface PromptText {
  characters: number;
  key: string;
}

const isTokenIds = (v: unknown): v is number[] =>
  Array.isArray(v) && v.length > 0 && v.every((t) => Number.isInteger(t));

// Token ids: one id is one token, so count 4 "characters" per id.
const tokenIdPrompt = (ids: number[]): PromptText => ({
  characters: ids.length * 4,
  key: JSON.stringify(ids),
});

/**
 * The prompts of a request. /v1/completions takes what vLLM's `CompletionRequest.prompt` does
 * (vllm/entrypoints/openai/completion/protocol.py: "list[int] | list[list[int]] | str |
 * list[str]"): a string or one token-id list is one prompt, a list of either is a batch. A
 * batch element gets the key it would have alone, so it answers as it would alone.
 */
function promptsOf(endpoint: Endpoint, body: Json): PromptText[] {
  if (endpoint === 'chat') {
    const messages = body['messages'];
    if (!Array.isArray(messages) || messages.length === 0)
      throw new SimRequestError(400, 'messages must be a non-empty array', 'messages');
    let characters = 0;
    messages.forEach((m, i) => {
      if (!isObject(m) || typeof m['role'] !== 'string')
        throw new SimRequestError(
          400,
          `messages[${i}] must be an object with a string role`,
          'messages',
        );
      characters += contentLength(m['content'], i);
    });
    return [{ characters, key: JSON.stringify(messages) }];
  }
  const prompt = body['prompt'];
  if (typeof prompt === 'string') return [{ characters: prompt.length, key: prompt }];
  if (isTokenIds(prompt)) return [tokenIdPrompt(prompt)];
  if (Array.isArray(prompt) && prompt.length > 0) {
    if (prompt.every((p) => typeof p === 'string'))
      return (prompt as string[]).map((p) => ({ characters: p.length, key: p }));
    if (prompt.every(isTokenIds)) return (prompt as number[][]).map((ids) => tokenIdPrompt(ids));
  }
  throw new SimRequestError(
    400,
    'prompt must be a string, an array of strings, token ids, or an array of token-id arrays',
    'prompt',
  );
}

/**
 * `VLLM_MAX_N_SEQUENCES`'s default ("The maximum allowed value is controlled by the
 * `VLLM_MAX_N_SEQUENCES` environment variable (default: 16384)", vllm/sampling_params.py).
 */
const maxN = 16_384;

/**
 * vllm/sampling_params.py `_verify_num_sequences(self.n, "n")`: "n must be at least 1, got
 * {value}." and "n must be at most {max_n}, got {value}. ...", then `_verify_greedy_sampling`
 * when "self.temperature < _SAMPLING_EPS" (1e-5): "n must be 1 when using greedy sampling,
 * got {self.n}." All `VLLMValidationError`, answered 400 with no `param`.
 */
function parseN(body: Json): number {
  const value = body['n'];
  if (value === undefined || value === null) return 1;
  if (typeof value !== 'number' || !Number.isInteger(value))
    throw new SimRequestError(400, `n must be an int, got ${JSON.stringify(value)}`, 'n');
  if (value < 1) throw new SimRequestError(400, `n must be at least 1, got ${value}.`);
  if (value > maxN)
    throw new SimRequestError(
      400,
      `n must be at most ${maxN}, got ${value}. To increase this limit, set the VLLM_MAX_N_SEQUENCES environment variable.`,
    );
  const temperature = body['temperature'];
  if (value > 1 && typeof temperature === 'number' && temperature >= 0 && temperature < 1e-5)
    throw new SimRequestError(400, `n must be 1 when using greedy sampling, got ${value}.`);
  return value;
}

export function parseSimRequest(
  endpoint: Endpoint,
  body: unknown,
  servedModel: string,
  maxModelLen: number,
  policy: 'fcfs' | 'priority' = 'fcfs',
  /** A name this engine does not serve yet: true once a LoRA resolver loaded it. */
  resolve: (model: string) => boolean = () => false,
): SimRequest {
  if (!isObject(body)) throw new SimRequestError(400, 'request body must be a JSON object');
  // vLLM serves its own model when the request names none: `model: str | None = None` in
  // vllm/entrypoints/openai/chat_completion/protocol.py, and _is_model_supported returns True
  // for an empty name (vllm/entrypoints/openai/engine/serving.py).
  const named = body['model'];
  if (named !== undefined && named !== null && typeof named !== 'string')
    throw new SimRequestError(400, 'model must be a string', 'model');
  const model = named === undefined || named === null || named === '' ? servedModel : named;
  // vLLM asks its LoRA resolvers for a name it does not serve before answering 404
  // (`_check_model`, vllm/entrypoints/openai/engine/serving.py).
  if (model !== servedModel && !resolve(model))
    throw new SimRequestError(404, `The model \`${model}\` does not exist.`, 'model');
  const stream = optionalBoolean(body, 'stream');
  const streamOptions = body['stream_options'];
  let includeUsage = false;
  if (streamOptions !== undefined && streamOptions !== null) {
    if (!stream)
      throw new SimRequestError(
        400,
        'Stream options can only be defined when `stream=True`.',
        'stream_options',
      );
    if (!isObject(streamOptions))
      throw new SimRequestError(400, 'stream_options must be an object', 'stream_options');
    includeUsage = optionalBoolean(streamOptions, 'include_usage');
  }

  const maxTokens =
    endpoint === 'chat'
      ? (optionalPositiveInt(body, 'max_completion_tokens') ??
        optionalPositiveInt(body, 'max_tokens'))
      : optionalPositiveInt(body, 'max_tokens');
  const prompts = promptsOf(endpoint, body);
  // Documented override: a test can state the prompt's token count instead of sending it
  // (for every prompt of a batch).
  const statedTokens = optionalPositiveInt(body, 'sim_prompt_tokens');
  const promptTokens = prompts.map((p) => statedTokens ?? Math.max(1, countTokens(p.characters)));
  // Each prompt is checked on its own, as vLLM renders each prompt of a batch on its own.
  for (const tokens of promptTokens) {
    const requested = tokens + (maxTokens ?? 0);
    if (tokens >= maxModelLen || requested > maxModelLen)
      throw new SimRequestError(
        400,
        `This model's maximum context length is ${maxModelLen} tokens. However, you requested ${requested} tokens (${tokens} in the messages, ${maxTokens ?? 0} in the completion). Please reduce the length of the messages or completion.`,
      );
  }
  const n = parseN(body);
  const priorityValue = body['priority'] ?? 0;
  if (!Number.isInteger(priorityValue))
    throw new SimRequestError(400, 'priority must be an integer', 'priority');
  const priority = priorityValue as number;
  // vllm/v1/engine/processor.py: "if priority != 0 and not self.scheduler_config.policy ==
  // 'priority': raise ValueError(f'Got priority {priority} but Priority scheduling is not
  // enabled.')", answered 400.
  if (priority !== 0 && policy !== 'priority')
    throw new SimRequestError(
      400,
      `Got priority ${priority} but Priority scheduling is not enabled.`,
      'priority',
    );
  const cacheSalt = cacheSaltOf(body);
  const seedValue = body['seed'];
  if (seedValue !== undefined && seedValue !== null && !Number.isInteger(seedValue))
    throw new SimRequestError(400, 'seed must be an integer', 'seed');
  const seed = seedValue as number | null | undefined;
  // vllm/v1/engine/parallel_sampling.py `_get_child_sampling_params`: "# Each child gets a
  // clone with a unique seed: child_sampling_params.seed = seed + index". Without a seed vLLM
  // samples each child at random; the simulator stays deterministic with a per-choice key.
  // Choice 0 keeps the key of an `n` = 1 request, so its answer does not change with `n`.
  const seedKey = (choice: number): string =>
    seed === undefined || seed === null
      ? choice === 0
        ? ''
        : `#${choice}`
      : String(seed + choice);

  const choices: SimChoice[] = [];
  prompts.forEach((prompt, promptIndex) => {
    for (let choiceIndex = 0; choiceIndex < n; choiceIndex += 1)
      choices.push({
        index: promptIndex * n + choiceIndex,
        promptIndex,
        choiceIndex,
        promptTokens: promptTokens[promptIndex]!,
        promptText: prompt.key,
        seed: hash32(`${model}\u0000${prompt.key}\u0000${seedKey(choiceIndex)}`),
      });
  });
  const promptText =
    prompts.length === 1 ? prompts[0]!.key : JSON.stringify(prompts.map((p) => p.key));

  return {
    endpoint,
    model,
    stream,
    includeUsage,
    n,
    choices,
    numPrompts: prompts.length,
    promptTokens: promptTokens.reduce((sum, tokens) => sum + tokens, 0),
    maxTokens,
    ignoreEos: optionalBoolean(body, 'ignore_eos'),
    seed:
      choices.length === 1
        ? choices[0]!.seed
        : hash32(`${model}\u0000${promptText}\u0000${String(seed ?? '')}\u0000n=${n}`),
    promptText,
    priority,
    cacheSalt,
  };
}
