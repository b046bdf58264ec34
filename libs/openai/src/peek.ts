import {
  COLON,
  COMMA,
  LBRACE,
  LBRACKET,
  LOWER_F,
  LOWER_N,
  LOWER_T,
  MINUS,
  NINE,
  QUOTE,
  RBRACE,
  RBRACKET,
  ZERO,
} from './bytes.js';
import { decodeString, numberValue } from './decode.js';
import { RequestPeekError } from './errors.js';
import { numberAsBool, strAsBool, strAsInt } from './lax.js';
import {
  bindWords,
  endOfInput,
  releaseWords,
  lastStringEscaped,
  scanString,
  skipValue,
  skipWhitespace,
  unexpected,
} from './scan.js';
import type { ByteSpan, PeekedRequest } from './types.js';
import { invalidUtf8At, isUtf8 } from './utf8.js';

const OTHER = 0;
const MODEL = 1;
const STREAM = 2;
const MAX_TOKENS = 3;
const MAX_COMPLETION_TOKENS = 4;
const MESSAGES = 5;
const PROMPT = 6;
const MIN_TOKENS = 7;
const ECHO = 8;
const TOOLS = 9;
const DOCUMENTS = 10;
const N = 11;
const PRIORITY = 12;
const CHAT_TEMPLATE = 13;
const CHAT_TEMPLATE_KWARGS = 14;
const PROMPT_LOGPROBS = 15;
const RETURN_TOKEN_IDS = 16;
const RETURN_PROMPT_TEXT = 17;
const TRUNCATE_PROMPT_TOKENS = 18;

const ascii = (s: string): Uint8Array => Uint8Array.from(s, (c) => c.charCodeAt(0));
const MODEL_KEY = ascii('model');
const STREAM_KEY = ascii('stream');
const PROMPT_KEY = ascii('prompt');
const MESSAGES_KEY = ascii('messages');
const MAX_TOKENS_KEY = ascii('max_tokens');
const MAX_COMPLETION_TOKENS_KEY = ascii('max_completion_tokens');
const MIN_TOKENS_KEY = ascii('min_tokens');
const ECHO_KEY = ascii('echo');
const TOOLS_KEY = ascii('tools');
const DOCUMENTS_KEY = ascii('documents');
const PRIORITY_KEY = ascii('priority');
const CHAT_TEMPLATE_KEY = ascii('chat_template');
const CHAT_TEMPLATE_KWARGS_KEY = ascii('chat_template_kwargs');
const PROMPT_LOGPROBS_KEY = ascii('prompt_logprobs');
const RETURN_TOKEN_IDS_KEY = ascii('return_token_ids');
const RETURN_PROMPT_TEXT_KEY = ascii('return_prompt_text');
const TRUNCATE_PROMPT_TOKENS_KEY = ascii('truncate_prompt_tokens');

const BY_NAME = new Map<string, number>([
  ['model', MODEL],
  ['stream', STREAM],
  ['max_tokens', MAX_TOKENS],
  ['max_completion_tokens', MAX_COMPLETION_TOKENS],
  ['messages', MESSAGES],
  ['prompt', PROMPT],
  ['min_tokens', MIN_TOKENS],
  ['echo', ECHO],
  ['tools', TOOLS],
  ['documents', DOCUMENTS],
  ['n', N],
  ['priority', PRIORITY],
  ['chat_template', CHAT_TEMPLATE],
  ['chat_template_kwargs', CHAT_TEMPLATE_KWARGS],
  ['prompt_logprobs', PROMPT_LOGPROBS],
  ['return_token_ids', RETURN_TOKEN_IDS],
  ['return_prompt_text', RETURN_PROMPT_TEXT],
  ['truncate_prompt_tokens', TRUNCATE_PROMPT_TOKENS],
]);
/** Longest raw key that can unescape to a known name: 22 characters, 6 bytes each as \uXXXX. */
const MAX_ESCAPED_KEY = 22 * 6;

function same(b: Uint8Array, s: number, key: Uint8Array): boolean {
  for (let k = 0; k < key.length; k++) if (b[s + k] !== key[k]) return false;
  return true;
}

/** Which field the raw key bytes [s, e) name, compared after unescaping. */
function keyId(b: Uint8Array, s: number, e: number, escaped: boolean): number {
  if (escaped) {
    return e - s <= MAX_ESCAPED_KEY ? (BY_NAME.get(decodeString(b, s, e)) ?? OTHER) : OTHER;
  }
  switch (e - s) {
    case 1:
      return b[s] === LOWER_N ? N : OTHER;
    case 4:
      return b[s] === 0x65 /* e */ && same(b, s, ECHO_KEY) ? ECHO : OTHER;
    case 5:
      // model or tools: the first byte picks the one to compare, so `model`, on every
      // request, costs one byte comparison more than before tools.
      return b[s] === 0x6d /* m */
        ? same(b, s, MODEL_KEY)
          ? MODEL
          : OTHER
        : b[s] === 0x74 /* t */ && same(b, s, TOOLS_KEY)
          ? TOOLS
          : OTHER;
    case 6:
      return same(b, s, STREAM_KEY) ? STREAM : same(b, s, PROMPT_KEY) ? PROMPT : OTHER;
    case 8:
      return same(b, s, MESSAGES_KEY) ? MESSAGES : same(b, s, PRIORITY_KEY) ? PRIORITY : OTHER;
    case 9:
      return b[s] === 0x64 /* d */ && same(b, s, DOCUMENTS_KEY) ? DOCUMENTS : OTHER;
    case 10:
      // max_tokens or min_tokens: a key not starting with 'm' is neither, and the second byte
      // picks the one to compare, so a 10-byte key costs no more than before min_tokens.
      if (b[s] !== 0x6d /* m */) return OTHER;
      return b[s + 1] === 0x61 /* a */
        ? same(b, s, MAX_TOKENS_KEY)
          ? MAX_TOKENS
          : OTHER
        : same(b, s, MIN_TOKENS_KEY)
          ? MIN_TOKENS
          : OTHER;
    case 13:
      return b[s] === 0x63 /* c */ && same(b, s, CHAT_TEMPLATE_KEY) ? CHAT_TEMPLATE : OTHER;
    // The keys with which vLLM returns or truncates the prompt: lengths no other key has, each
    // tested for its first byte before any loop.
    case 15:
      return b[s] === 0x70 /* p */ && same(b, s, PROMPT_LOGPROBS_KEY) ? PROMPT_LOGPROBS : OTHER;
    case 16:
      return b[s] === 0x72 /* r */ && same(b, s, RETURN_TOKEN_IDS_KEY) ? RETURN_TOKEN_IDS : OTHER;
    case 18:
      return b[s] === 0x72 /* r */ && same(b, s, RETURN_PROMPT_TEXT_KEY)
        ? RETURN_PROMPT_TEXT
        : OTHER;
    case 20:
      return b[s] === 0x63 /* c */ && same(b, s, CHAT_TEMPLATE_KWARGS_KEY)
        ? CHAT_TEMPLATE_KWARGS
        : OTHER;
    case 21:
      return same(b, s, MAX_COMPLETION_TOKENS_KEY) ? MAX_COMPLETION_TOKENS : OTHER;
    case 22:
      return b[s] === 0x74 /* t */ && same(b, s, TRUNCATE_PROMPT_TOKENS_KEY)
        ? TRUNCATE_PROMPT_TOKENS
        : OTHER;
    default:
      return OTHER;
  }
}

function span(start: number, end: number): ByteSpan | undefined {
  return start < 0 ? undefined : { start, end };
}

/**
 * What vLLM's pydantic makes of the value [s, e) of an `int` field, in lax mode: a number
 * without a fraction (1e2 and 100.0 are 100, -0 is 0), true and false as 1 and 0, a string of
 * an integer as `strAsInt` reads it ("100", " 100 ", "1_000", "100.0"); undefined for null,
 * NaN for anything pydantic refuses.
 */
function laxInt(b: Uint8Array, s: number, e: number): number | undefined {
  const c = b[s]!;
  if (c === LOWER_N) return undefined;
  if (c === MINUS || (c >= ZERO && c <= NINE)) {
    const v = numberValue(b, s, e);
    return Number.isInteger(v) ? v + 0 : NaN;
  }
  if (c === LOWER_T) return 1;
  if (c === LOWER_F) return 0;
  if (c === QUOTE) return strAsInt(decodeString(b, s + 1, e - 1));
  return NaN;
}

/**
 * An integer >= `min` (0 or 1) as `laxInt` reads it, or null (undefined); anything else, and
 * integers above 2^53 - 1 (which pydantic takes but a double cannot hold), is a field error.
 */
function tokenCount(
  b: Uint8Array,
  s: number,
  e: number,
  field: string,
  min: 0 | 1 = 0,
): number | undefined {
  if (s < 0) return undefined;
  const v = laxInt(b, s, e);
  if (v === undefined) return undefined;
  if (Number.isSafeInteger(v) && v >= min) return v;
  const kind = min === 0 ? 'non-negative' : 'positive';
  throw RequestPeekError.field(field, `${field} must be a ${kind} integer or null`, s);
}

/** `laxBool`'s answer for a value pydantic's `bool` refuses. */
const NOT_BOOL = -1;
/** Longest raw string that can unescape to a word `strAsBool` takes: 5 characters as \uXXXX. */
const MAX_ESCAPED_BOOL = 5 * 6;

/**
 * What vLLM's pydantic makes of the value [s, e) of a `bool` field, in lax mode: 1 for true,
 * 0 for false (the numbers 0 and 1, and the strings `strAsBool` reads, included); undefined for
 * null; NOT_BOOL for anything pydantic refuses.
 */
function laxBool(b: Uint8Array, s: number, e: number): number | undefined {
  const c = b[s]!;
  let v: boolean | undefined;
  if (c === LOWER_T) v = true;
  else if (c === LOWER_F) v = false;
  else if (c === LOWER_N) return undefined;
  else if (c === MINUS || (c >= ZERO && c <= NINE)) v = numberAsBool(numberValue(b, s, e));
  else if (c === QUOTE && e - s - 2 <= MAX_ESCAPED_BOOL)
    v = strAsBool(decodeString(b, s + 1, e - 1));
  return v === undefined ? NOT_BOOL : v ? 1 : 0;
}

/**
 * A flag that only decides whether the prompt may be touched (`echo`, `return_token_ids`,
 * `return_prompt_text`): never refused, since vLLM refuses a value its pydantic does not
 * take; such a value counts as on, so that the prompt is left as the client sent it. Undefined
 * when absent or null.
 */
function flag(b: Uint8Array, s: number, e: number): boolean | undefined {
  if (s < 0) return undefined;
  const v = laxBool(b, s, e);
  return v === undefined ? undefined : v !== 0;
}

/**
 * How many prompts a `prompt` value holds: the elements of an array of strings or of token-id
 * arrays (a batch), else 1 (a string, or one prompt as token ids). vLLM refuses an empty batch
 * and mixed shapes itself; they count 1 here.
 */
function promptsIn(b: Uint8Array, s: number, e: number): number {
  if (b[s] !== LBRACKET) return 1;
  let i = skipWhitespace(b, s + 1, e);
  const c = b[i]!;
  if (c === RBRACKET || c === MINUS || (c >= ZERO && c <= NINE)) return 1;
  let count = 0;
  for (;;) {
    count += 1;
    i = skipWhitespace(b, skipValue(b, i, e, 2), e);
    if (b[i] !== COMMA) return count;
    i = skipWhitespace(b, i + 1, e);
  }
}

/**
 * Engine requests vLLM makes of a request to `endpoint`: `n` (default 1) times, on
 * `/v1/completions`, the prompts of a batch. vLLM V1 schedules each as a request of its own,
 * counted in `vllm:num_requests_running` (vllm/v1/engine/async_llm.py `add_request`: "Fan out
 * child requests (for n>1)"). The chat endpoint has no `prompt`: a stray one is ignored, as
 * vLLM ignores it.
 */
export function engineRequests(peeked: PeekedRequest, endpoint: 'chat' | 'completion'): number {
  const prompts = endpoint === 'completion' ? peeked.prompts : 1;
  return Math.min((peeked.n ?? 1) * prompts, Number.MAX_SAFE_INTEGER);
}

/**
 * Validates the whole body as JSON in one forward pass over its bytes, without building it,
 * and returns the top-level fields Sluice needs. Throws RequestPeekError for anything else,
 * invalid UTF-8 included.
 */
export function peekRequest(body: Buffer | Uint8Array): PeekedRequest {
  // JSON text is UTF-8 (RFC 8259 §8.1); decoding invalid bytes would hand the engine
  // U+FFFD in place of what the client sent.
  if (!isUtf8(body)) {
    const at = invalidUtf8At(body);
    throw RequestPeekError.json(at, `invalid UTF-8 (byte 0x${body[at]!.toString(16)})`);
  }
  bindWords(body);
  try {
    return peek(body);
  } finally {
    releaseWords();
  }
}

function peek(b: Uint8Array): PeekedRequest {
  const n = b.length;
  let i = skipWhitespace(b, 0, n);
  if (i >= n) throw endOfInput(n, 'expected a JSON object');
  if (b[i] !== LBRACE) {
    if (i === 0 && n >= 3 && b[0] === 0xef && b[1] === 0xbb && b[2] === 0xbf) {
      throw RequestPeekError.json(0, 'a byte order mark (BOM) is not allowed');
    }
    // Report bad JSON before the wrong shape, as a full parse would.
    const start = i;
    i = skipWhitespace(b, skipValue(b, i, n, 0), n);
    if (i < n) throw unexpected(b, i, n, 'expected the end of the body');
    throw RequestPeekError.shape(start, 'request body must be a JSON object');
  }
  const objectStart = i;
  let objectEnd: number;
  // Value spans of the last occurrence of each field (JSON.parse keeps the last); -1: absent.
  let modelStart = -1;
  let modelEnd = -1;
  let streamStart = -1;
  let streamEnd = -1;
  let maxTokensStart = -1;
  let maxTokensEnd = -1;
  let maxCompletionStart = -1;
  let maxCompletionEnd = -1;
  let messagesStart = -1;
  let messagesEnd = -1;
  let promptStart = -1;
  let promptEnd = -1;
  let minTokensStart = -1;
  let minTokensEnd = -1;
  let echoStart = -1;
  let toolsStart = -1;
  let toolsEnd = -1;
  let documentsStart = -1;
  let documentsEnd = -1;
  let nStart = -1;
  let nEnd = -1;
  let priorityStart = -1;
  let priorityEnd = -1;
  let templateStart = -1;
  let templateEnd = -1;
  let kwargsStart = -1;
  let kwargsEnd = -1;
  let promptLogprobsStart = -1;
  let returnTokenIdsStart = -1;
  let returnTokenIdsEnd = -1;
  let returnPromptTextStart = -1;
  let returnPromptTextEnd = -1;
  let truncateStart = -1;
  let echoEnd = -1;

  i = skipWhitespace(b, i + 1, n);
  if (i < n && b[i] === RBRACE) {
    objectEnd = i;
  } else {
    for (;;) {
      if (i >= n || b[i] !== QUOTE) {
        throw unexpected(b, i, n, `expected '"' to start an object key`);
      }
      const keyStart = i + 1;
      i = scanString(b, keyStart, n);
      const id = keyId(b, keyStart, i - 1, lastStringEscaped());
      i = skipWhitespace(b, i, n);
      if (i >= n || b[i] !== COLON) throw unexpected(b, i, n, "expected ':' after an object key");
      const valueStart = skipWhitespace(b, i + 1, n);
      i = skipValue(b, valueStart, n, 1);
      switch (id) {
        case MODEL:
          modelStart = valueStart;
          modelEnd = i;
          break;
        case STREAM:
          streamStart = valueStart;
          streamEnd = i;
          break;
        case MAX_TOKENS:
          maxTokensStart = valueStart;
          maxTokensEnd = i;
          break;
        case MAX_COMPLETION_TOKENS:
          maxCompletionStart = valueStart;
          maxCompletionEnd = i;
          break;
        case MESSAGES:
          messagesStart = valueStart;
          messagesEnd = i;
          break;
        case PROMPT:
          promptStart = valueStart;
          promptEnd = i;
          break;
        case MIN_TOKENS:
          minTokensStart = valueStart;
          minTokensEnd = i;
          break;
        case ECHO:
          echoStart = valueStart;
          echoEnd = i;
          break;
        case TOOLS:
          toolsStart = valueStart;
          toolsEnd = i;
          break;
        case DOCUMENTS:
          documentsStart = valueStart;
          documentsEnd = i;
          break;
        case N:
          nStart = valueStart;
          nEnd = i;
          break;
        case PRIORITY:
          priorityStart = valueStart;
          priorityEnd = i;
          break;
        case CHAT_TEMPLATE:
          templateStart = valueStart;
          templateEnd = i;
          break;
        case CHAT_TEMPLATE_KWARGS:
          kwargsStart = valueStart;
          kwargsEnd = i;
          break;
        case PROMPT_LOGPROBS:
          promptLogprobsStart = valueStart;
          break;
        case RETURN_TOKEN_IDS:
          returnTokenIdsStart = valueStart;
          returnTokenIdsEnd = i;
          break;
        case RETURN_PROMPT_TEXT:
          returnPromptTextStart = valueStart;
          returnPromptTextEnd = i;
          break;
        case TRUNCATE_PROMPT_TOKENS:
          truncateStart = valueStart;
          break;
      }
      i = skipWhitespace(b, i, n);
      if (i < n && b[i] === COMMA) {
        i = skipWhitespace(b, i + 1, n);
        continue;
      }
      if (i < n && b[i] === RBRACE) {
        objectEnd = i;
        break;
      }
      throw unexpected(b, i, n, "expected ',' or '}' after an object member");
    }
  }
  i = skipWhitespace(b, objectEnd + 1, n);
  if (i < n) throw unexpected(b, i, n, 'expected the end of the body after the top-level object');

  // Fields are checked only now, so that the last of duplicate keys is the one that counts.
  // `model` is optional, as in vLLM's request models (`model: str | None = None`,
  // vllm/entrypoints/openai/chat_completion/protocol.py and completion/protocol.py), which
  // serve a body without one, or with null or "", with the engine's first model
  // (`_is_model_supported`, vllm/entrypoints/openai/engine/serving.py): where such a request
  // goes is the gateway's decision.
  let model: string | undefined;
  if (modelStart >= 0 && b[modelStart] !== LOWER_N) {
    if (b[modelStart] !== QUOTE) {
      throw RequestPeekError.field('model', 'model must be a string or null', modelStart);
    }
    model = decodeString(b, modelStart + 1, modelEnd - 1);
  }

  // Read as vLLM's pydantic reads it: "true", "yes", 1 … stream, and the gateway must answer
  // a stream to a client who asked for one however it spelled it.
  let stream: boolean | undefined;
  if (streamStart >= 0) {
    const v = laxBool(b, streamStart, streamEnd);
    if (v === NOT_BOOL) {
      throw RequestPeekError.field('stream', 'stream must be a boolean or null', streamStart);
    }
    stream = v === undefined ? undefined : v === 1;
  }
  const maxTokens = tokenCount(b, maxTokensStart, maxTokensEnd, 'max_tokens');
  const maxCompletionTokens = tokenCount(
    b,
    maxCompletionStart,
    maxCompletionEnd,
    'max_completion_tokens',
  );
  // Checked like the limits: the rewrite must know the floor it may not scale below, and a
  // value it cannot read would make vLLM's answer depend on the load.
  const minTokens = tokenCount(b, minTokensStart, minTokensEnd, 'min_tokens');
  if (messagesStart >= 0) {
    const c = b[messagesStart];
    if (c === LOWER_N) messagesStart = -1;
    else if (c !== LBRACKET) {
      throw RequestPeekError.field('messages', 'messages must be an array', messagesStart);
    }
  }
  // Choices per prompt: vLLM V1 runs each as an engine request of its own, so the cap counts
  // them (vllm/v1/engine/async_llm.py `add_request`, "Fan out child requests (for n>1)").
  const choices = tokenCount(b, nStart, nEnd, 'n', 1);
  if (promptStart >= 0 && b[promptStart] === LOWER_N) promptStart = -1;
  const prompts = promptStart < 0 ? 1 : promptsIn(b, promptStart, promptEnd);
  // vLLM's `priority` orders its own queue and picks whom it preempts under a priority
  // policy (vllm/v1/core/sched/scheduler.py): a client setting it would pass the release
  // order Sluice keeps (the x-sluice-priority header, capped per tenant).
  // A 0 in any form pydantic reads as 0 ("0", false, 0.0) is the default, and passes.
  if (priorityStart >= 0 && b[priorityStart] !== LOWER_N) {
    if (laxInt(b, priorityStart, priorityEnd) !== 0)
      throw RequestPeekError.field(
        'priority',
        'priority is set by Sluice (the x-sluice-priority header), not by the body: send 0 or leave it out',
        priorityStart,
      );
  }
  if (templateStart >= 0 && b[templateStart] === LOWER_N) templateStart = -1;
  if (kwargsStart >= 0 && b[kwargsStart] === LOWER_N) kwargsStart = -1;
  if (toolsStart >= 0 && b[toolsStart] === LOWER_N) toolsStart = -1;
  if (documentsStart >= 0 && b[documentsStart] === LOWER_N) documentsStart = -1;
  // What vLLM returns or truncates of the prompt: the rewrite leaves such a prompt alone.
  // Never refused (they gate nothing). prompt_logprobs and truncate_prompt_tokens are on with
  // any value but null: every value vLLM takes is an integer (false as 0), and even the
  // smallest does something: prompt_logprobs 0 scores every prompt token (0 is the number of
  // extra candidates per position), truncate_prompt_tokens -1 truncates to the context window
  // and 0 to nothing (vllm/renderers/params.py `TokenizeParams._token_truncation`).
  const echo = flag(b, echoStart, echoEnd);
  const returnTokenIds = flag(b, returnTokenIdsStart, returnTokenIdsEnd);
  const returnPromptText = flag(b, returnPromptTextStart, returnPromptTextEnd);
  const promptLogprobs = promptLogprobsStart >= 0 && b[promptLogprobsStart] !== LOWER_N;
  const truncatePromptTokens = truncateStart >= 0 && b[truncateStart] !== LOWER_N;

  return {
    model,
    stream,
    maxTokens,
    maxCompletionTokens,
    minTokens,
    echo,
    promptLogprobs,
    returnTokenIds,
    returnPromptText,
    truncatePromptTokens,
    n: choices,
    prompts,
    messages: span(messagesStart, messagesEnd),
    prompt: span(promptStart, promptEnd),
    tools: span(toolsStart, toolsEnd),
    documents: span(documentsStart, documentsEnd),
    chatTemplate: span(templateStart, templateEnd),
    chatTemplateKwargs: span(kwargsStart, kwargsEnd),
    modelSpan: span(modelStart, modelEnd),
    streamSpan: span(streamStart, streamEnd),
    maxTokensSpan: span(maxTokensStart, maxTokensEnd),
    maxCompletionTokensSpan: span(maxCompletionStart, maxCompletionEnd),
    objectStart,
    objectEnd,
  };
}
