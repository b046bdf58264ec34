// Validates an OpenAI request the way vLLM's server does where it matters here, and
// reduces it to what the engine needs: prompt length, output length, stream flags.
import { countTokens, hash32 } from './text.js';

export type Endpoint = 'chat' | 'completion';

export interface SimRequest {
  endpoint: Endpoint;
  model: string;
  stream: boolean;
  includeUsage: boolean;
  promptTokens: number;
  /** `max_tokens` / `max_completion_tokens`, or undefined for "up to the context". */
  maxTokens: number | undefined;
  ignoreEos: boolean;
  /** Seed of the output words: prompt, model and `seed`, never the stream flags. */
  seed: number;
  /** The prompt as text (messages as JSON), the content the prefix cache hashes. */
  promptText: string;
  /** vLLM's `priority` request field (default 0; lower is served first under `priority`). */
  priority: number;
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

function promptOf(endpoint: Endpoint, body: Json): { characters: number; key: string } {
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
    return { characters, key: JSON.stringify(messages) };
  }
  const prompt = body['prompt'];
  if (typeof prompt === 'string') return { characters: prompt.length, key: prompt };
  if (Array.isArray(prompt) && prompt.length === 1 && typeof prompt[0] === 'string')
    return { characters: prompt[0].length, key: prompt[0] };
  if (Array.isArray(prompt) && prompt.length > 0 && prompt.every((t) => Number.isInteger(t)))
    // Token ids: one id is one token, so count 4 "characters" per id.
    return { characters: prompt.length * 4, key: JSON.stringify(prompt) };
  throw new SimRequestError(
    400,
    'prompt must be a string, a one-string array, or token ids',
    'prompt',
  );
}

export function parseSimRequest(
  endpoint: Endpoint,
  body: unknown,
  servedModel: string,
  maxModelLen: number,
  policy: 'fcfs' | 'priority' = 'fcfs',
): SimRequest {
  if (!isObject(body)) throw new SimRequestError(400, 'request body must be a JSON object');
  const model = body['model'];
  if (typeof model !== 'string') throw new SimRequestError(400, 'model must be a string', 'model');
  if (model !== servedModel)
    throw new SimRequestError(404, `The model \`${model}\` does not exist.`, 'model');
  const n = body['n'];
  if (n !== undefined && n !== null && n !== 1)
    throw new SimRequestError(400, 'the simulator supports n = 1 only', 'n');

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
  const prompt = promptOf(endpoint, body);
  // Documented override: a test can state the prompt's token count instead of sending it.
  const promptTokens =
    optionalPositiveInt(body, 'sim_prompt_tokens') ?? Math.max(1, countTokens(prompt.characters));
  const requested = promptTokens + (maxTokens ?? 0);
  if (promptTokens >= maxModelLen || requested > maxModelLen)
    throw new SimRequestError(
      400,
      `This model's maximum context length is ${maxModelLen} tokens. However, you requested ${requested} tokens (${promptTokens} in the messages, ${maxTokens ?? 0} in the completion). Please reduce the length of the messages or completion.`,
    );
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
  const seedValue = body['seed'];
  if (seedValue !== undefined && seedValue !== null && !Number.isInteger(seedValue))
    throw new SimRequestError(400, 'seed must be an integer', 'seed');

  return {
    endpoint,
    model,
    stream,
    includeUsage,
    promptTokens,
    maxTokens,
    ignoreEos: optionalBoolean(body, 'ignore_eos'),
    seed: hash32(`${model}\u0000${prompt.key}\u0000${String(seedValue ?? '')}`),
    promptText: prompt.key,
    priority,
  };
}
