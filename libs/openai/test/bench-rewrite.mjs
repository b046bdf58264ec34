// One-off timing of the release-time rewrite (peekRequest + rewriteRequest) against the naive
// way (JSON.parse(buf.toString()), edit the object, Buffer.from(JSON.stringify(...))) on chat
// bodies of 1 KiB, 64 KiB and 1 MiB.
// Run after a build:
//   cd /work/main && npx tsc -b libs/openai && node --expose-gc libs/openai/test/bench-rewrite.mjs
// Not a test: timing is printed, never asserted. Without --expose-gc the bytes column is left out.
import { Buffer } from 'node:buffer';
import { performance } from 'node:perf_hooks';
import { peekRequest, rewriteRequest } from '../dist/index.js';

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

/** A chat body of about `target` bytes: a system prompt, then messages of up to 8 KB. */
function chatBody(target, seed) {
  const random = rng(seed);
  const messages = [{ role: 'system', content: 'You are a helpful assistant.' }];
  let size = 200;
  while (size < target) {
    const len = Math.min(target - size, 500 + Math.floor(random() * 8000));
    const c = content(random, Math.max(len, 20));
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

const PLAN = {
  endpoint: 'chat',
  instruction: 'Provide extremely short answers only. No explanations. Code only if asked.',
  systemPrompt: 'prepend',
  completionPrefix: false,
  maxTokensFactor: 0.3,
  minMaxTokens: 16,
  defaultMaxTokens: 1024,
};
const APPEND = { ...PLAN, systemPrompt: 'append' };

const splice = (plan) => (buf) => rewriteRequest(buf, peekRequest(buf), plan);

/** The rewrite of `buf` given its peek, done once up front. */
function rewriteOnly(buf) {
  const peeked = peekRequest(buf);
  return (b) => rewriteRequest(b, peeked, PLAN);
}

/** The same edits on the parsed object (prepend, as PLAN), re-serialised. */
function naive(buf) {
  const o = JSON.parse(buf.toString());
  o.messages.unshift({ role: 'system', content: PLAN.instruction });
  o.max_tokens = Math.min(
    o.max_tokens,
    Math.max(PLAN.minMaxTokens, Math.round(o.max_tokens * PLAN.maxTokensFactor)),
  );
  return Buffer.from(JSON.stringify(o));
}

/** JSON.parse + JSON.stringify alone, with no edit and no encoding back to bytes. */
const parseStringify = (buf) => JSON.stringify(JSON.parse(buf.toString()));

function median(samples) {
  samples.sort((a, b) => a - b);
  return samples[Math.floor(samples.length / 2)];
}

/**
 * Milliseconds per call: the median and the mean of the samples (the mean carries the GC and
 * allocator stalls the median leaves out). Warms up first (at least 200 calls and ~300 ms, so
 * that the JS paths run optimised, as in a long-lived dispatcher), then times batches of calls
 * sized to take ~0.2 ms each, so that small bodies are not lost in the timer's resolution.
 */
function time(fn, buf, rounds) {
  // Start each measurement from a collected heap, so that one's garbage is not the next's cost.
  globalThis.gc?.();
  const start = performance.now();
  let calls = 0;
  while (calls < 200 || (calls < 50_000 && performance.now() - start < 300)) {
    fn(buf);
    calls++;
  }
  const batch = Math.max(1, Math.ceil(0.2 / ((performance.now() - start) / calls)));
  const samples = [];
  let sum = 0;
  for (let r = 0; r < rounds; r++) {
    const t0 = performance.now();
    for (let k = 0; k < batch; k++) fn(buf);
    const per = (performance.now() - t0) / batch;
    samples.push(per);
    sum += per;
  }
  return { median: median(samples), mean: sum / rounds };
}

/**
 * Bytes one call allocates: JS heap growth plus ArrayBuffer growth (Buffers live outside the
 * heap) across one call, right after a full GC, median of 21 calls. A young-generation GC
 * during the call would hide garbage, so treat it as a lower bound.
 */
function allocated(fn, buf) {
  if (typeof globalThis.gc !== 'function') return undefined;
  const samples = [];
  let keep;
  for (let r = 0; r < 21; r++) {
    globalThis.gc();
    const before = process.memoryUsage();
    keep = fn(buf);
    const after = process.memoryUsage();
    samples.push(after.heapUsed - before.heapUsed + (after.arrayBuffers - before.arrayBuffers));
  }
  if (keep === undefined) throw new Error('unreachable');
  return median(samples);
}

const kib = (n) => (n === undefined ? '–' : `${(n / 1024).toFixed(n < 10240 ? 1 : 0)} KiB`);
const ms = (v) => (v < 0.1 ? `${(v * 1000).toFixed(1)} µs` : `${v.toFixed(2)} ms`);

const bodies = [
  ['1 KiB', Buffer.from(JSON.stringify(chatBody(1 << 10, 11)))],
  ['64 KiB', Buffer.from(JSON.stringify(chatBody(64 << 10, 12)))],
  ['1 MiB', Buffer.from(JSON.stringify(chatBody(1 << 20, 13)))],
];
const methods = [
  ['peekRequest alone', () => (b) => peekRequest(b)],
  ['peekRequest + rewriteRequest, prepend', () => splice(PLAN)],
  ['peekRequest + rewriteRequest, append', () => splice(APPEND)],
  ['rewriteRequest alone (peek done)', rewriteOnly],
  ['JSON.parse + edit + JSON.stringify + Buffer.from', () => naive],
  ['JSON.parse + JSON.stringify alone (no edit)', () => parseStringify],
];
const rounds = Number(process.argv[2] ?? 300);
const results = methods.map(([name, make]) => ({
  name,
  cells: bodies.map(([, buf]) => {
    const fn = make(buf);
    return { ...time(fn, buf, rounds), bytes: allocated(fn, buf) };
  }),
}));

console.log(`bodies: ${bodies.map(([n, b]) => `${n} = ${b.length} bytes`).join(', ')}`);
console.log('median (mean) per request; allocated per request in the last three columns\n');
console.log(
  `| method | ${bodies.map(([n]) => n).join(' | ')} | ${bodies.map(([n]) => n).join(' | ')} |`,
);
console.log(`|---|${bodies.map(() => '---:|').join('')}${bodies.map(() => '---:|').join('')}`);
for (const { name, cells } of results) {
  const times = cells.map((c) => `${ms(c.median)} (${ms(c.mean)})`).join(' | ');
  console.log(`| ${name} | ${times} | ${cells.map((c) => kib(c.bytes)).join(' | ')} |`);
}
const ours = results[1].cells;
const naiveCells = results[4].cells;
console.log(
  `\nspeed-up of peek + rewrite (prepend) over parse + edit + stringify, by median: ` +
    bodies
      .map(([n], k) => `${n} ${(naiveCells[k].median / ours[k].median).toFixed(1)}×`)
      .join(', '),
);
