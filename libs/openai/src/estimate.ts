// The prompt-token estimate: one forward pass over the bytes of each span the peek found
// (`messages`, `tools` and `documents` for chat; `prompt` for completions), counting the
// characters of strings (Unicode code points after unescaping) without decoding them. No
// allocation, no JSON.parse, never throws; on bytes that are not well-formed JSON it still
// ends, with a count of whatever it saw.
//
// As in scan.ts, the loops compare against byte literals (named in a comment) and copy the
// table into a local: V8 reloads an imported or module-level binding on every use.

import type { ByteSpan, PeekedRequest } from './types.js';

/** Characters per token: vLLM's tokenizers average ~4 on English; the engine simulator uses 4. */
const CHARS_PER_TOKEN = 4;

/**
 * What one image, audio or video item in `messages` counts, in characters: 1,024 tokens,
 * whatever it holds. A vision model turns an image into a few hundred to a few thousand tokens
 * (its processor's patches), a video or an audio clip into as many or more, whether the
 * engine fetches it from an http(s) URL or decodes it from a `data:` URL or base64: counted
 * by characters, a 300 KB photo read as 100,000 tokens (the long-prompt lane), and an image
 * by https URL as 15 tokens (charged nothing, the short lane). An item is the value of a key
 * that vLLM reads as one (MEDIA_KEYS), and a `data` string longer than this (`prompt_embeds`).
 */
const MEDIA_CHARS = 1024 * CHARS_PER_TOKEN;

// What countSpan counts. Messages: the code points of string values (a chat template writes a
// message's role and content, never its keys), an image, audio or video item at a fixed cost.
// Prompt: ceil(code points / 4) per string, 1 per number (a token id). Definitions (`tools`,
// RAG `documents`): the code points of every string, keys included, since chat templates
// write each definition as JSON (`tojson`).
const VALUES = 0;
const TOKEN_IDS = 1;
const ALL_STRINGS = 2;
type Counting = typeof VALUES | typeof TOKEN_IDS | typeof ALL_STRINGS;

/**
 * Per byte inside a string: 0 for a byte that starts a character (ASCII or a UTF-8 lead byte),
 * 1 for a UTF-8 continuation byte (0b10xxxxxx), 8 for '"' and '\' (the run ends there). Four
 * entries sum to 8 or more exactly when one of them is a stop, since four continuations sum to 4.
 */
const STRING_BYTE = new Uint8Array(256);
for (let c = 0x80; c < 0xc0; c++) STRING_BYTE[c] = 1;
STRING_BYTE[0x22] = 8;
STRING_BYTE[0x5c] = 8;

/**
 * Estimated prompt tokens of a peeked request for `endpoint`: for `chat`, its `messages` (the
 * characters of every string value in it, each image, audio or video item 1,024 tokens) plus its `tools` and `documents` (the characters of
 * every string in them, keys included), over 4, rounded up; for `completion`, its `prompt`
 * (each string ceil(characters / 4), each token id 1); 0 when those fields are absent or null.
 * The tool definitions count because the chat template writes them into the prompt the engine
 * prefills: a 40,000-character tool description is ~10,000 tokens however short the messages.
 * The other endpoint's field is never read, as vLLM never reads it: its CompletionRequest has
 * no `messages` nor its ChatCompletionRequest a `prompt`, and extra fields are accepted and
 * ignored (OpenAIBaseModel, `extra="allow"`, vllm/entrypoints/openai/protocol.py). So a body
 * cannot hide a long prompt behind an empty `messages`. See the README
 * ("Prompt-token estimate"). `peeked` must be `peekRequest(body)`; a span that does not fit
 * the body is clamped to it.
 */
export function estimatePromptTokens(
  body: Uint8Array,
  peeked: PeekedRequest,
  endpoint: 'chat' | 'completion',
): number {
  if (endpoint === 'chat') {
    const { messages, tools, documents, chatTemplate, chatTemplateKwargs } = peeked;
    let chars = 0;
    if (messages !== undefined) chars += countSpan(body, messages, VALUES);
    if (tools !== undefined) chars += countSpan(body, tools, ALL_STRINGS);
    if (documents !== undefined) chars += countSpan(body, documents, ALL_STRINGS);
    // Merged over the template's arguments, `tools` and `documents` included: a prompt can
    // travel there as well as in `documents`.
    if (chatTemplateKwargs !== undefined) chars += countSpan(body, chatTemplateKwargs, ALL_STRINGS);
    if (chatTemplate !== undefined) chars += countSpan(body, chatTemplate, VALUES);
    return Math.ceil(chars / CHARS_PER_TOKEN);
  }
  const prompt = peeked.prompt;
  return prompt === undefined ? 0 : countSpan(body, prompt, TOKEN_IDS);
}

/**
 * Walks the span once. VALUES: the total code points of all string values, a media item
 * (the value of a MEDIA_KEYS key, a long `data` string) MEDIA_CHARS; object keys (a string
 * followed by ':'), numbers and literals count nothing. TOKEN_IDS: the sum of
 * ceil(code points / 4) over the string values, plus 1 per number (a token id). ALL_STRINGS:
 * the total code points of all strings, keys too.
 */
function countSpan(b: Uint8Array, span: ByteSpan, counting: Counting): number {
  let i = span.start;
  let n = span.end;
  if (!Number.isSafeInteger(i) || !Number.isSafeInteger(n)) return 0;
  if (i < 0) i = 0;
  if (n > b.length) n = b.length;
  const table = STRING_BYTE;
  let total = 0;
  // The key whose value comes next, when it may be a media item: one of MEDIA_KEYS (the whole
  // value is the item), or `data` (a long string is one).
  let mediaKey = NO_MEDIA_KEY;
  while (i < n) {
    const c = b[i]!;
    if (mediaKey === ITEM_KEY && c !== 0x20 && c !== 0x0a && c !== 0x0d && c !== 0x09) {
      // The value of a media key, whatever it is (a URL of any scheme, an object with one, or
      // null beside a `uuid` of a cached item): one item, none of its strings.
      total += MEDIA_CHARS;
      mediaKey = NO_MEDIA_KEY;
      i = skipValue(b, i, n);
      continue;
    }
    if (c === 0x22 /* " */) {
      // A string: count its code points (bytes less continuation bytes), a run at a time.
      i++;
      const start = i;
      let chars = 0;
      for (;;) {
        const run = i;
        let continuation = 0;
        // Four bytes a step while none of them is a stop (measured 1.5x the plain byte loop),
        // then byte by byte up to the stop.
        while (i + 4 <= n) {
          const s = table[b[i]!]! + table[b[i + 1]!]! + table[b[i + 2]!]! + table[b[i + 3]!]!;
          if (s >= 8) break;
          continuation += s;
          i += 4;
        }
        let k = 0;
        while (i < n && (k = table[b[i]!]!) < 8) {
          continuation += k;
          i++;
        }
        chars += i - run - continuation;
        if (i >= n) break;
        if (b[i] === 0x22 /* " */) {
          i++;
          break;
        }
        // A backslash: every escape is one character, a \uXXXX surrogate pair too.
        chars++;
        if (i + 1 < n && b[i + 1] === 0x75 /* u */) {
          i += isSurrogatePair(b, i, n) ? 12 : 6;
        } else {
          i += 2;
        }
      }
      // A key is followed by ':' (whitespace between is skipped here, once).
      while (i < n) {
        const w = b[i]!;
        if (w === 0x20 || w === 0x0a || w === 0x0d || w === 0x09) i++;
        else break;
      }
      if (i < n && b[i] === 0x3a /* : */) {
        i++;
        if (counting === ALL_STRINGS) total += chars;
        else if (counting === VALUES) mediaKey = mediaKeyAt(b, start, chars);
      } else if (counting === TOKEN_IDS) {
        total += Math.ceil(chars / CHARS_PER_TOKEN);
      } else if (counting === VALUES && chars > MEDIA_CHARS && mediaKey === DATA_KEY) {
        // Base64 bytes, not text: a fixed cost.
        total += MEDIA_CHARS;
        mediaKey = NO_MEDIA_KEY;
      } else {
        total += chars;
        mediaKey = NO_MEDIA_KEY;
      }
    } else if (
      counting === TOKEN_IDS &&
      (c === 0x2d /* - */ || (c >= 0x30 && c <= 0x39)) /* 0-9 */
    ) {
      // A number: one token id, whatever its form.
      total++;
      i++;
      while (i < n) {
        const d = b[i]!;
        if (
          (d >= 0x30 && d <= 0x39) /* 0-9 */ ||
          d === 0x2e /* . */ ||
          d === 0x65 /* e */ ||
          d === 0x45 /* E */ ||
          d === 0x2b /* + */ ||
          d === 0x2d /* - */
        ) {
          i++;
        } else {
          break;
        }
      }
    } else {
      // Anything but whitespace between a key and its value: the value is not a string.
      if (c !== 0x20 && c !== 0x0a && c !== 0x0d && c !== 0x09) mediaKey = NO_MEDIA_KEY;
      i++;
    }
  }
  return total;
}

const NO_MEDIA_KEY = 0;
const ITEM_KEY = 1;
const DATA_KEY = 2;

/**
 * Keys whose value vLLM reads as one image, audio or video item, wherever the key sits in a
 * content part: its part parsers (`MM_PARSER_MAP` and `_parse_chat_message_content_mm_part`,
 * vllm/entrypoints/chat_utils.py) take `image_url` (`{"url": …}`, or a plain string for
 * `input_image` parts and parts without a `type`), `video_url`, `audio_url`, `input_audio`
 * (`{"data", "format"}`), and precomputed `image_embeds` / `audio_embeds`. The engine
 * fetches an http(s) URL itself, so the item's size in the body says nothing of its tokens.
 */
const MEDIA_KEYS: readonly (readonly number[])[] = [
  'image_url',
  'video_url',
  'audio_url',
  'input_audio',
  'image_embeds',
  'audio_embeds',
].map((k) => Array.from(k, (ch) => ch.charCodeAt(0)));
const DATA = Array.from('data', (ch) => ch.charCodeAt(0));

/**
 * Which media-bearing key the key of `chars` characters starting at `i` is, if any: compared
 * after unescaping (`"image\u005furl"` is `image_url`, as JSON.parse and vLLM read it),
 * without decoding. The first byte rules out almost every other key.
 */
function mediaKeyAt(b: Uint8Array, i: number, chars: number): number {
  if (chars === 4) return isKey(b, i, DATA) ? DATA_KEY : NO_MEDIA_KEY;
  if (chars < 9 || chars > 12) return NO_MEDIA_KEY;
  for (const key of MEDIA_KEYS) {
    if (key.length === chars && isKey(b, i, key)) return ITEM_KEY;
  }
  return NO_MEDIA_KEY;
}

/**
 * Whether the string starting at `i` (after its opening quote) unescapes to exactly `key`
 * (ASCII letters and '_', so only a `\uXXXX` escape can spell one of its characters).
 */
function isKey(b: Uint8Array, i: number, key: readonly number[]): boolean {
  for (const want of key) {
    const c = b[i];
    if (c === 0x5c /* \ */) {
      if (b[i + 1] !== 0x75 /* u */) return false;
      let unit = 0;
      for (let k = 2; k < 6; k++) {
        const h = b[i + k]! | 0x20;
        const digit = h >= 0x30 && h <= 0x39 ? h - 0x30 : h >= 0x61 && h <= 0x66 ? h - 0x57 : -1;
        if (digit < 0) return false;
        unit = unit * 16 + digit;
      }
      if (unit !== want) return false;
      i += 6;
    } else {
      if (c !== want) return false;
      i++;
    }
  }
  return b[i] === 0x22; // "
}

/**
 * One past the JSON value that starts at `i` (a string, an object or array with whatever nests
 * in it, or a literal up to the next ',', '}' or ']'), without counting it; `n` at the latest.
 * Strings are found with indexOf (native), so a 400 KB base64 string costs little.
 */
function skipValue(b: Uint8Array, i: number, n: number): number {
  let depth = 0;
  while (i < n) {
    const c = b[i]!;
    if (c === 0x22 /* " */) {
      i = skipString(b, i + 1, n);
      if (depth === 0) return i;
      continue;
    }
    if (c === 0x7b /* { */ || c === 0x5b /* [ */) {
      depth++;
    } else if (c === 0x7d /* } */ || c === 0x5d /* ] */) {
      if (depth === 0) return i;
      if (--depth === 0) return i + 1;
    } else if (c === 0x2c /* , */ && depth === 0) {
      return i;
    }
    i++;
  }
  return n;
}

/** One past the closing quote of the string whose contents start at `i`; `n` at the latest. */
function skipString(b: Uint8Array, i: number, n: number): number {
  for (;;) {
    const q = b.indexOf(0x22 /* " */, i);
    if (q < 0 || q >= n) return n;
    // Escaped when an odd number of backslashes runs up to it.
    let k = q;
    while (k > i && b[k - 1] === 0x5c /* \ */) k--;
    if ((q - k) % 2 === 0) return q + 1;
    i = q + 1;
  }
}

/**
 * Whether the `\u` escape at `i` is a high surrogate (`\uD800`–`\uDBFF`) directly followed by a
 * low one (`\uDC00`–`\uDFFF`): JSON.parse makes the two one code point. Looks at the third hex
 * digit only; the peek has checked that all four are hex.
 */
function isSurrogatePair(b: Uint8Array, i: number, n: number): boolean {
  if (i + 12 > n) return false;
  if ((b[i + 2]! | 0x20) !== 0x64 /* d */) return false;
  const high = b[i + 3]! | 0x20;
  if (high !== 0x38 && high !== 0x39 && high !== 0x61 && high !== 0x62) return false; // 8 9 a b
  if (b[i + 6] !== 0x5c /* \ */ || b[i + 7] !== 0x75 /* u */) return false;
  if ((b[i + 8]! | 0x20) !== 0x64 /* d */) return false;
  const low = b[i + 9]! | 0x20;
  return low >= 0x63 && low <= 0x66; // c d e f
}
