// Where an engine answer's `usage` is, in the chunks the dispatcher keeps by reference: a
// stream's last bytes, or a non-streamed answer's top-level `usage` member, found by walking back
// from the end (output-tokens.ts says why the walk, and what vLLM writes after `usage`).

const NEWLINE = 0x0a;
const SPACE = 0x20;
const QUOTE = 0x22;
const BACKSLASH = 0x5c;
const COLON = 0x3a;
const OPEN_BRACE = 0x7b;
const CLOSE_BRACE = 0x7d;
const OPEN_BRACKET = 0x5b;
const CLOSE_BRACKET = 0x5d;
/** The member name after its opening quote: `usage` and the closing quote. */
const USAGE_NAME = Buffer.from('usage"');

/** The last `count` bytes of the body (the whole of a shorter one). */
export function lastBytes(parts: Buffer[], count: number): Buffer {
  const last = parts[parts.length - 1]!;
  if (last.length >= count || parts.length === 1)
    return last.subarray(Math.max(0, last.length - count));
  const pieces: Buffer[] = [];
  let need = count;
  for (let i = parts.length - 1; i >= 0 && need > 0; i--) {
    const part = parts[i]!;
    pieces.push(part.length > need ? part.subarray(part.length - need) : part);
    need -= part.length;
  }
  return Buffer.concat(pieces.reverse());
}

/**
 * The top-level `usage` object of a JSON object held in `parts`, found by walking back from the
 * end (see the top of this file); undefined when there is none, it is not an object, or the body
 * is not a JSON object.
 */
export function topLevelUsage(parts: Buffer[]): Buffer | undefined {
  // 0 before the object's last `}`; then how deep the walk is, the top-level object being 1.
  let depth = 0;
  let inString = false;
  // At depth 1: the last value walked over was an object, where it opens and closes.
  let object = false;
  let openPart = 0;
  let openAt = 0;
  let closePart = 0;
  let closeAt = 0;
  // A ':' at depth 1 was walked over (the string before it names a member), and its value.
  let member = false;
  let memberIsObject = false;
  // A byte loop with no calls on the way: only the bytes after `usage` are read, and with
  // prompt_logprobs that is some 60 per prompt token.
  for (let p = parts.length - 1; p >= 0; p--) {
    const part = parts[p]!;
    for (let i = part.length - 1; i >= 0; i--) {
      const byte = part[i]!;
      if (inString) {
        // A string's opening quote: the first quote before its end that no backslash escapes.
        if (byte !== QUOTE || escaped(parts, p, i)) continue;
        inString = false;
        if (member) {
          member = false;
          if (followedBy(parts, p, i, USAGE_NAME)) {
            return memberIsObject ? span(parts, openPart, openAt, closePart, closeAt) : undefined;
          }
        }
      } else if (byte === QUOTE) {
        if (depth === 0) return undefined; // not a JSON object
        inString = true;
        if (depth === 1) object = false;
      } else if (byte === CLOSE_BRACE || byte === CLOSE_BRACKET) {
        if (depth === 0 && byte !== CLOSE_BRACE) return undefined;
        depth += 1;
        if (depth === 2) {
          closePart = p;
          closeAt = i;
        }
      } else if (byte === OPEN_BRACE || byte === OPEN_BRACKET) {
        // At depth 1, the top-level object's start: it has no `usage`.
        if (depth <= 1) return undefined;
        depth -= 1;
        if (depth === 1) {
          object = byte === OPEN_BRACE;
          openPart = p;
          openAt = i;
        }
      } else if (depth === 1) {
        if (byte === COLON) {
          member = true;
          memberIsObject = object;
        } else if (!isSpace(byte)) {
          object = false;
        }
      } else if (depth === 0 && !isSpace(byte)) {
        return undefined; // not a JSON object
      }
    }
  }
  return undefined;
}

/** Whether an odd number of backslashes comes just before the byte at `at` of part `p`. */
function escaped(parts: Buffer[], p: number, at: number): boolean {
  let odd = false;
  for (;;) {
    while (at === 0) {
      if (p === 0) return odd;
      p -= 1;
      at = parts[p]!.length;
    }
    at -= 1;
    if (parts[p]![at] !== BACKSLASH) return odd;
    odd = !odd;
  }
}

/** Whether `bytes` come just after the byte at `at` of part `p`. */
function followedBy(parts: Buffer[], p: number, at: number, bytes: Buffer): boolean {
  at += 1;
  for (let i = 0; i < bytes.length; i++, at++) {
    while (at >= parts[p]!.length) {
      if (p === parts.length - 1) return false;
      p += 1;
      at = 0;
    }
    if (parts[p]![at] !== bytes[i]) return false;
  }
  return true;
}

/** The bytes from one position to another, both included: copied only when they span parts. */
function span(parts: Buffer[], fromPart: number, from: number, toPart: number, to: number): Buffer {
  if (fromPart === toPart) return parts[fromPart]!.subarray(from, to + 1);
  const pieces = [parts[fromPart]!.subarray(from)];
  for (let part = fromPart + 1; part < toPart; part++) pieces.push(parts[part]!);
  pieces.push(parts[toPart]!.subarray(0, to + 1));
  return Buffer.concat(pieces);
}

function isSpace(byte: number): boolean {
  return byte === SPACE || byte === NEWLINE || byte === 0x0d || byte === 0x09;
}
