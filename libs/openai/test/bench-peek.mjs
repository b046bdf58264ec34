// One-off timing of peekRequest against JSON.parse(buf.toString()) on realistic chat bodies.
// Run after a build: cd /work/main && npx tsc -b libs/openai && node libs/openai/test/bench-peek.mjs
// Not a test: timing is printed, never asserted.
import { Buffer } from 'node:buffer';
import { performance } from 'node:perf_hooks';
import { peekRequest } from '../dist/index.js';

const WORDS = (
  'the model answers in a few tokens while the queue drains and every engine keeps its KV ' +
  'cache below the threshold so that admission stays fair across tenants and pools'
).split(' ');
const UNICODE = ['café', 'naïve', '—', '“quoted”', '中文文本', '日本語', '😀', 'Ελληνικά', 'ü'];

/** Deterministic pseudo-random numbers (mulberry32). */
function rng(seed) {
  return () => {
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function content(random, bytes) {
  const parts = [];
  let size = 0;
  while (size < bytes) {
    const r = random();
    let w;
    if (r < 0.03) w = UNICODE[Math.floor(random() * UNICODE.length)];
    else if (r < 0.05) w = '\n';
    else if (r < 0.06) w = 'say "hi"';
    else if (r < 0.065) w = 'C:\\path\\to\\file\tx';
    else w = WORDS[Math.floor(random() * WORDS.length)];
    parts.push(w);
    size += w.length + 1;
  }
  return parts.join(' ');
}

/** A chat body of about `target` bytes: many messages with long contents. */
function chatBody(target, seed) {
  const random = rng(seed);
  const messages = [{ role: 'system', content: 'You are a helpful assistant.' }];
  let size = 200;
  while (size < target) {
    const len = 500 + Math.floor(random() * 8000);
    const c = content(random, len);
    messages.push({ role: messages.length % 2 ? 'user' : 'assistant', content: c });
    size += Buffer.byteLength(c) + 40;
  }
  return {
    model: 'meta-llama/Llama-3.1-8B-Instruct',
    messages,
    max_tokens: 512,
    stream: true,
    temperature: 0.7,
  };
}

/** Many tiny messages: the walk's per-token cost, not its string skipping. */
function shortMessages(target) {
  const messages = [];
  for (let size = 0; size < target; size += 40)
    messages.push({ role: 'user', content: 'ok, go on' });
  return { model: 'm', messages };
}

/** A completions prompt given as token ids. */
function tokenIds(target) {
  const random = rng(6);
  const prompt = [];
  for (let size = 0; size < target; size += 6) prompt.push(Math.floor(random() * 128_000));
  return { model: 'm', prompt, max_tokens: 16 };
}

/** Python's json.dumps default (ensure_ascii): every non-ASCII character as \uXXXX. */
function asciiJson(value) {
  return JSON.stringify(value).replace(
    /[\u0080-\uffff]/g,
    (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`,
  );
}

function time(fn, buf, rounds) {
  for (let k = 0; k < 50; k++) fn(buf);
  const samples = [];
  for (let r = 0; r < rounds; r++) {
    const t0 = performance.now();
    fn(buf);
    samples.push(performance.now() - t0);
  }
  samples.sort((a, b) => a - b);
  return samples[Math.floor(samples.length / 2)];
}

const cases = [
  ['1 MiB chat, raw UTF-8', Buffer.from(JSON.stringify(chatBody(1 << 20, 1)))],
  ['1 MiB chat, ensure_ascii', Buffer.from(asciiJson(chatBody(1 << 20, 2)))],
  ['1 MiB chat, pretty-printed', Buffer.from(JSON.stringify(chatBody(1 << 20, 3), null, 2))],
  ['260 KB chat', Buffer.from(JSON.stringify(chatBody(260_000, 4)))],
  ['6 KB chat', Buffer.from(JSON.stringify(chatBody(2_000, 5)))],
  ['1 MiB of short messages', Buffer.from(JSON.stringify(shortMessages(1 << 20)))],
  ['1 MiB prompt of token ids', Buffer.from(JSON.stringify(tokenIds(1 << 20)))],
];
const rounds = Number(process.argv[2] ?? 300);
console.log(
  '| body | bytes | peekRequest ms | JSON.parse(buf.toString()) ms | speed-up | JSON.parse(text) alone ms |',
);
console.log('|---|---:|---:|---:|---:|---:|');
for (const [name, buf] of cases) {
  const text = buf.toString();
  const peek = time((b) => peekRequest(b), buf, rounds);
  const parse = time((b) => JSON.parse(b.toString()), buf, rounds);
  const parseOnly = time((t) => JSON.parse(t), text, rounds);
  console.log(
    `| ${name} | ${buf.length} | ${peek.toFixed(3)} | ${parse.toFixed(3)} | ${(parse / peek).toFixed(1)}× | ${parseOnly.toFixed(3)} |`,
  );
}
