// OpenAI-shaped bodies and stream chunks, as vLLM writes them (field order included).
import type { FinishReason } from './scheduler.js';
import type { SimRequest } from './openai-request.js';
import { prng } from './text.js';

export interface OutputPlan {
  outputTokens: number;
  finishReason: FinishReason;
}

/** How many tokens the answer has: its natural (seeded) length, cut by max_tokens. */
export function planOutput(
  request: SimRequest,
  limits: { maxModelLen: number; outputLenMin: number; outputLenMax: number },
): OutputPlan {
  const limit = request.maxTokens ?? limits.maxModelLen - request.promptTokens;
  if (request.ignoreEos) return { outputTokens: limit, finishReason: 'length' };
  const span = limits.outputLenMax - limits.outputLenMin + 1;
  const natural = limits.outputLenMin + Math.floor(prng(request.seed ^ 0x9e3779b9)() * span);
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

  /** The first stream chunk of a chat answer: the role, empty content. */
  roleChunk(): string {
    return JSON.stringify({
      ...this.head('chat.completion.chunk'),
      choices: [
        {
          index: 0,
          delta: { role: 'assistant', content: '' },
          logprobs: null,
          finish_reason: null,
        },
      ],
    });
  }

  tokenChunk(text: string, finishReason: FinishReason | null): string {
    if (this.request.endpoint === 'chat')
      return JSON.stringify({
        ...this.head('chat.completion.chunk'),
        choices: [
          {
            index: 0,
            delta: { content: text },
            logprobs: null,
            finish_reason: finishReason,
            stop_reason: null,
          },
        ],
      });
    return JSON.stringify({
      ...this.head('text_completion'),
      choices: [{ index: 0, text, logprobs: null, finish_reason: finishReason, stop_reason: null }],
    });
  }

  usageChunk(usage: Usage): string {
    const object = this.request.endpoint === 'chat' ? 'chat.completion.chunk' : 'text_completion';
    return JSON.stringify({ ...this.head(object), choices: [], usage });
  }

  body(text: string, finishReason: FinishReason, usage: Usage): string {
    if (this.request.endpoint === 'chat')
      return JSON.stringify({
        ...this.head('chat.completion'),
        choices: [
          {
            index: 0,
            message: { role: 'assistant', content: text, tool_calls: [] },
            logprobs: null,
            finish_reason: finishReason,
            stop_reason: null,
          },
        ],
        usage,
      });
    return JSON.stringify({
      ...this.head('text_completion'),
      choices: [{ index: 0, text, logprobs: null, finish_reason: finishReason, stop_reason: null }],
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
