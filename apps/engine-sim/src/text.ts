// Deterministic output: the same prompt always produces the same words, so a response
// relayed by Sluice can be compared byte for byte with one fetched directly.

/** FNV-1a, 32 bit. Not cryptographic; only needs to spread prompts over seeds. */
export function hash32(text: string, seed = 0x811c9dc5): number {
  let h = seed >>> 0;
  for (let i = 0; i < text.length; i += 1) {
    h ^= text.charCodeAt(i);
    h = Math.imul(h, 0x01000193) >>> 0;
  }
  return h;
}

/** mulberry32: a tiny, fast PRNG with a 32-bit state. */
export function prng(seed: number): () => number {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const vocabulary = (
  'the of and to in is that for it as with on be by this are from or at an which can not ' +
  'model token cache batch queue engine request stream latency memory block prefill decode ' +
  'gateway broker admission limit load answer short long fast slow prompt reply wait run'
).split(' ');

/** Yields token texts: the first without a leading space, the rest with one. */
export function tokenStream(seed: number): () => string {
  const next = prng(seed);
  let first = true;
  return () => {
    const word = vocabulary[Math.floor(next() * vocabulary.length)]!;
    if (first) {
      first = false;
      return word;
    }
    return ` ${word}`;
  };
}

/** The simulator's tokenizer: ceil(characters / 4), as documented in the README. */
export function countTokens(characters: number): number {
  return Math.ceil(characters / 4);
}
