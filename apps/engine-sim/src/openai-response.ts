// OpenAI-shaped bodies and stream chunks, as vLLM writes them (field order included).
import type { FinishReason } from './scheduler.js';
import type { SimChoice, SimRequest } from './openai-request.js';
import { prng } from './text.js';

export interface OutputPlan {
  outputTokens: number;
  finishReason: FinishReason;
}

/** How many tokens one choice has: its natural (seeded) length, cut by max_tokens. */
export function planOutput(
  request: SimRequest,
  choice: SimChoice,
  limits: { maxModelLen: number; outputLenMin: number; outputLenMax: number },
): OutputPlan {
  const limit = request.maxTokens ?? limits.maxModelLen - choice.promptTokens;
  if (request.ignoreEos) return { outputTokens: limit, finishReason: 'length' };
  const span = limits.outputLenMax - limits.outputLenMin + 1;
  const natural = limits.outputLenMin + Math.floor(prng(choice.seed ^ 0x9e3779b9)() * span);
  return natural <= limit
    ? { outputTokens: natural, finishReason: 'stop' }
    : { outputTokens: limit, finishReason: 'length' };
}

export interface Usage {
  prompt_tokens: number;
  total_tokens: number;
  completion_tokens: number;
}

export function usageOf(promptTokens: number, completionTokens: number): Usage {
  return {
    prompt_tokens: promptTokens,
    total_tokens: promptTokens + completionTokens,
    completion_tokens: completionTokens,
  };
}

/** One finished choice of a non-streaming answer. */
export interface ChoiceText {
  index: number;
  text: string;
  finishReason: FinishReason;
}

export class ResponseWriter {
  readonly id: string;

  constructor(
    private readonly request: SimRequest,
    private readonly created: number,
  ) {
    const prefix = request.endpoint === 'chat' ? 'chatcmpl' : 'cmpl';
    // Derived from the request so that a replayed request is byte-identical (vLLM
    // randomises ids; the simulator prefers reproducibility).
    this.id = `${prefix}-${request.seed.toString(16).padStart(8, '0')}${(request.maxTokens ?? 0).toString(16)}`;
  }

  private head(object: string) {
    return { id: this.id, object, created: this.created, model: this.request.model };
  }

  /**
   * The first stream chunk of a chat choice: the role, empty content. vLLM sends one per
   * choice, each in its own chunk, before the first token ("for i in range(num_choices):
   * choice_data = ChatCompletionResponseStreamChoice(index=i, delta=DeltaMessage(role=role,
   * content=''), ...)", serving_chat.py).
   */
  roleChunk(index: number): string {
    return JSON.stringify({
      ...this.head('chat.completion.chunk'),
      choices: [
        {
          index,
          delta: { role: 'assistant', content: '' },
          logprobs: null,
          finish_reason: null,
        },
      ],
    });
  }

  /** One token of one choice: vLLM streams each choice's output in its own chunk. */
  tokenChunk(index: number, text: string, finishReason: FinishReason | null): string {
    if (this.request.endpoint === 'chat')
      return JSON.stringify({
        ...this.head('chat.completion.chunk'),
        choices: [
          {
            index,
            delta: { content: text },
            logprobs: null,
            finish_reason: finishReason,
            stop_reason: null,
          },
        ],
      });
    return JSON.stringify({
      ...this.head('text_completion'),
      choices: [{ index, text, logprobs: null, finish_reason: finishReason, stop_reason: null }],
    });
  }

  usageChunk(usage: Usage): string {
    const object = this.request.endpoint === 'chat' ? 'chat.completion.chunk' : 'text_completion';
    return JSON.stringify({ ...this.head(object), choices: [], usage });
  }

  /** A non-streaming answer: every choice, in `index` order, and the request's usage. */
  body(choices: readonly ChoiceText[], usage: Usage): string {
    if (this.request.endpoint === 'chat')
      return JSON.stringify({
        ...this.head('chat.completion'),
        choices: choices.map((c) => ({
          index: c.index,
          message: { role: 'assistant', content: c.text, tool_calls: [] },
          logprobs: null,
          finish_reason: c.finishReason,
          stop_reason: null,
        })),
        usage,
      });
    return JSON.stringify({
      ...this.head('text_completion'),
      choices: choices.map((c) => ({
        index: c.index,
        text: c.text,
        logprobs: null,
        finish_reason: c.finishReason,
        stop_reason: null,
      })),
      usage,
    });
  }
}

export function errorBody(
  status: number,
  type: string,
  message: string,
  param: string | null = null,
): string {
  return JSON.stringify({ error: { message, type, param, code: status } });
}
