// Block hashes of a prompt for the prefix cache, after vllm/v1/core/kv_cache_utils.py
// `hash_block_tokens` ("hash((parent_block_hash, curr_block_token_ids_tuple,
// extra_keys))", chained from the first block) over full blocks only
// (`get_request_block_hasher`: a partial last block gets no hash).
//
// The simulator has no token ids, so it derives pseudo-tokens from the request's text:
// token i is characters [4i, 4i + 4) of the text (the same 4 characters per token the
// prompt length is counted with), and positions past the text (a `sim_prompt_tokens`
// prompt longer than its text) are fillers keyed by the whole text. An identical prefix,
// such as a repeated system prompt, therefore gives identical leading block hashes.
//
// A request's `cache_salt` goes into the first block's hash only, as vLLM's
// `generate_block_hash_extra_keys` puts it among that block's extra keys ("cache_salt_keys:
// list[str] = [request.cache_salt] if (start_token_idx == 0 and request.cache_salt) else []");
// every later hash chains its parent's, so requests with different salts (or one with and one
// without) share no block, and requests with the same salt share as unsalted ones do.
import { createHash } from 'node:crypto';

const CHARS_PER_TOKEN = 4;

export function promptBlockHashes(
  text: string,
  promptTokens: number,
  blockSize: number,
  cacheSalt?: string,
): string[] {
  const fullBlocks = Math.floor(promptTokens / blockSize);
  const textTokens = Math.ceil(text.length / CHARS_PER_TOKEN);
  const filler = createHash('sha256').update(text).digest('hex').slice(0, 16);
  const hashes: string[] = [];
  let parent = '';
  for (let b = 0; b < fullBlocks; b += 1) {
    const h = createHash('sha256');
    // Length-prefixed after a byte no unsalted input starts with (those start with the empty
    // parent's NUL): no text can make an unsalted first block hash like a salted one.
    if (b === 0 && cacheSalt) h.update(`\u0002${cacheSalt.length}:${cacheSalt}`);
    h.update(parent).update('\u0000');
    const first = b * blockSize;
    const last = first + blockSize;
    const inText = Math.min(last, textTokens);
    if (first < inText) h.update(text.slice(first * CHARS_PER_TOKEN, inText * CHARS_PER_TOKEN));
    if (last > textTokens) h.update(`\u0001${filler}:${Math.max(first, textTokens)}-${last}`);
    parent = h.digest('hex').slice(0, 32);
    hashes.push(parent);
  }
  return hashes;
}
