// Body handling: the gateway's single-pass peek, its prompt-token estimate and the dispatcher's
// degradation rewrite, on chat bodies of 1 KiB, 64 KiB and 1 MiB, against JSON.parse
// (+ JSON.stringify for the rewrite), in this process. Needs `--expose-gc` (the bench config passes it) for the bytes.
import { Buffer } from 'node:buffer';
import { performance } from 'node:perf_hooks';
import { defaultDegradation } from '@sluice/config';
import {
  estimatePromptTokens,
  peekRequest,
  rewriteRequest,
  type PeekedRequest,
  type RewritePlan,
} from '@sluice/openai';
import { expect, it } from 'vitest';
import { round, summarize, writeResult, type Figure, type ScenarioResult } from './results.ts';

const gc = globalThis.gc;
const REPEATS = 3;
/** Milliseconds of timed calls per measurement, after the warm-up. */
const MEASURE_MS = 200;

/** The shipped `lazy` profile's edit (libs/config's default degradation), on a chat body. */
const lazy = defaultDegradation.profiles.find((p) => p.name === 'lazy')!;
const PLAN: RewritePlan = {
  endpoint: 'chat',
  instruction: lazy.instruction!,
  systemPrompt: 'prepend',
  completionPrefix: false,
  maxTokensFactor: lazy.maxTokensFactor,
  minMaxTokens: defaultDegradation.minMaxTokens,
  defaultMaxTokens: defaultDegradation.defaultMaxTokens,
};

const WORDS = (
  'the model answers in a few tokens while the queue drains and every engine keeps its KV ' +
  'cache below the threshold so that admission stays fair across tenants and pools'
).split(' ');
const UNICODE = ['café', 'naïve', '—', '“quoted”', '中文文本', '😀', 'Ελληνικά'];

/** Deterministic pseudo-random numbers (mulberry32). */
function rng(seed: number) {
  return () => {
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** A chat body of about `bytes`: a system prompt, then turns of up to ~8 KB of mixed text. */
function chatBody(bytes: number, seed: number): Buffer {
  const random = rng(seed);
  const pick = <T>(from: T[]) => from[Math.floor(random() * from.length)]!;
  const messages = [{ role: 'system', content: 'You are a helpful assistant.' }];
  let size = 200;
  while (size < bytes) {
    const words: string[] = [];
    const target = Math.max(20, Math.min(bytes - size, 500 + random() * 8000));
    for (let n = 0; n < target;) {
      const r = random();
      const word = r < 0.03 ? pick(UNICODE) : r < 0.05 ? '\n' : r < 0.06 ? 'say "hi"' : pick(WORDS);
      words.push(word);
      n += Buffer.byteLength(word) + 1;
    }
    const content = words.join(' ');
    messages.push({ role: messages.length % 2 ? 'user' : 'assistant', content });
    size += Buffer.byteLength(content) + 40;
  }
  const body = { model: 'm', messages, max_tokens: 512, stream: true, temperature: 0.7 };
  return Buffer.from(JSON.stringify(body));
}

/** The same edit on the parsed object, serialised back to bytes for the engine. */
function parseEditStringify(buf: Buffer): Buffer {
  const o = JSON.parse(buf.toString()) as {
    messages: Array<{ role: string; content: unknown }>;
    max_tokens: number;
  };
  // The instruction joins a leading system message's text; a new one only where none leads.
  const first = o.messages[0];
  if (first?.role === 'system' && typeof first.content === 'string')
    first.content = `${PLAN.instruction}\n\n${first.content}`;
  else o.messages.unshift({ role: 'system', content: PLAN.instruction });
  o.max_tokens = Math.max(PLAN.minMaxTokens, Math.round(o.max_tokens * PLAN.maxTokensFactor));
  return Buffer.from(JSON.stringify(o));
}

const APPEND: RewritePlan = { ...PLAN, systemPrompt: 'append' };

const peekMethods: Array<[string, (buf: Buffer) => unknown]> = [
  ['peekRequest', (buf) => peekRequest(buf)],
  ['JSON.parse', (buf) => JSON.parse(buf.toString())],
];

/** The endpoint a body is for, as the gateway knows it from the path: chat bodies carry messages. */
const endpointOf = (peeked: PeekedRequest) => (peeked.messages ? 'chat' : 'completion');

/** The gateway's estimate on its own (the peek of `buf` done before), and after the peek. */
const estimateMethods = (
  buf: Buffer,
  withPeek: boolean,
): Array<[string, (buf: Buffer) => unknown]> => {
  const peeked = peekRequest(buf);
  const endpoint = endpointOf(peeked);
  const alone: [string, (buf: Buffer) => unknown] = [
    'estimatePromptTokens alone (peek done)',
    (b) => estimatePromptTokens(b, peeked, endpoint),
  ];
  if (!withPeek) return [alone];
  return [
    [
      'peekRequest + estimatePromptTokens',
      (b) => estimatePromptTokens(b, peekRequest(b), endpoint),
    ],
    alone,
  ];
};

const methods: Array<[string, (buf: Buffer) => unknown]> = [
  ...peekMethods,
  ['peekRequest + rewriteRequest', (buf) => rewriteRequest(buf, peekRequest(buf), PLAN)],
  [
    'peekRequest + rewriteRequest, appended to the system prompt',
    (buf) => rewriteRequest(buf, peekRequest(buf), APPEND),
  ],
  ['JSON.parse + edit + JSON.stringify', parseEditStringify],
];

/** Many tiny messages: the walk's cost per JSON token, not its string skipping. */
function shortMessages(bytes: number): Buffer {
  const messages = [];
  for (let size = 0; size < bytes; size += 40)
    messages.push({ role: 'user', content: 'ok, go on' });
  return Buffer.from(JSON.stringify({ model: 'm', messages }));
}

/** A completions prompt given as token ids. */
function tokenIds(bytes: number): Buffer {
  const random = rng(6);
  const prompt = [];
  for (let size = 0; size < bytes; size += 6) prompt.push(Math.floor(random() * 128_000));
  return Buffer.from(JSON.stringify({ model: 'm', prompt, max_tokens: 16 }));
}

/** Python's json.dumps default (ensure_ascii): every non-ASCII character as \uXXXX. */
function asciiJson(buf: Buffer): Buffer {
  return Buffer.from(
    buf
      .toString()
      .replace(/[\u0080-\uffff]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`),
  );
}

/** Bodies of other shapes a client may send, for the peek alone. */
const otherShapes = (): Array<[string, Buffer]> => [
  ['1 MiB chat, ensure_ascii', asciiJson(chatBody(1 << 20, 2))],
  [
    '1 MiB chat, pretty-printed',
    Buffer.from(JSON.stringify(JSON.parse(chatBody(1 << 20, 3).toString()), null, 2)),
  ],
  ['1 MiB of short messages', shortMessages(1 << 20)],
  ['1 MiB prompt of token ids', tokenIds(1 << 20)],
];

/**
 * Milliseconds per call, median over batches: warms up (JIT) first, then times batches of calls
 * sized to ~0.2 ms so that small bodies are not lost in the timer's resolution.
 */
function timePerCall(fn: (buf: Buffer) => unknown, buf: Buffer): number {
  gc?.();
  let start = performance.now();
  let calls = 0;
  for (; calls < 200 || (calls < 20_000 && performance.now() - start < 150); calls += 1) fn(buf);
  const batch = Math.max(1, Math.ceil(0.2 / ((performance.now() - start) / calls)));
  const samples: number[] = [];
  start = performance.now();
  while (samples.length < 20 || performance.now() - start < MEASURE_MS) {
    const t0 = performance.now();
    for (let k = 0; k < batch; k += 1) fn(buf);
    samples.push((performance.now() - t0) / batch);
  }
  return summarize(samples).median;
}

/**
 * Times each method on `buf` in repeats that interleave the methods, so that drift on the
 * machine hits all of them alike; records each one's spread in `runs` and returns the medians.
 */
function timeInterleaved(
  among: Array<[string, (buf: Buffer) => unknown]>,
  buf: Buffer,
  size: string,
  runs: NonNullable<ScenarioResult['runs']>,
): Map<string, number> {
  const ms = new Map<string, number[]>(among.map(([name]) => [name, []]));
  for (let r = 0; r < REPEATS; r += 1)
    for (const [name, fn] of among) ms.get(name)!.push(timePerCall(fn, buf));
  const median = new Map<string, number>();
  for (const [name] of among) {
    const s = summarize(ms.get(name)!);
    median.set(name, s.median);
    runs.push({
      n: REPEATS,
      min: round(s.min, 4),
      median: round(s.median, 4),
      max: round(s.max, 4),
      unit: 'ms',
      of: `${name}, ${size}`,
    });
  }
  return median;
}

/**
 * Bytes one call allocates: JS heap plus ArrayBuffer growth across the call, right after a full
 * GC, median of 15 calls, less what the measuring itself allocates. The bench config sizes the
 * young generation so that no scavenge runs inside one call; if one did, the figure would be a
 * lower bound.
 */
function bytesPerCall(fn: (buf: Buffer) => unknown, buf: Buffer): number {
  return growth(fn, buf) - growth(() => undefined, buf);
}

function growth(fn: (buf: Buffer) => unknown, buf: Buffer): number {
  const samples: number[] = [];
  const kept: unknown[] = [];
  for (let r = 0; r < 15; r += 1) {
    gc!();
    const before = process.memoryUsage();
    kept[0] = fn(buf);
    const after = process.memoryUsage();
    samples.push(after.heapUsed - before.heapUsed + (after.arrayBuffers - before.arrayBuffers));
  }
  return summarize(samples).median;
}

it('times the peek, the estimate and the rewrite against JSON.parse and JSON.stringify', () => {
  expect(gc, 'run with --expose-gc (test/bench/vitest.config.ts)').toBeTypeOf('function');
  const bodies: Array<[string, Buffer]> = [
    ['1 KiB', chatBody(1 << 10, 11)],
    ['64 KiB', chatBody(64 << 10, 12)],
    ['1 MiB', chatBody(1 << 20, 13)],
  ];
  const figures: Figure[] = [];
  const runs: NonNullable<ScenarioResult['runs']> = [];
  /** Times and sizes each method on `buf`, records it, and returns the median times. */
  const measure = (size: string, buf: Buffer, among: typeof methods) => {
    const median = timeInterleaved(among, buf, size, runs);
    for (const [name, fn] of among) {
      const of = `${name}, ${size}`;
      figures.push(
        { name: `time per request: ${of}`, value: round(median.get(name)!, 4), unit: 'ms' },
        {
          name: `allocated per request: ${of}`,
          value: round(bytesPerCall(fn, buf) / 1024, 1),
          unit: 'KiB',
        },
      );
    }
    return (ours: string, theirs: string) =>
      figures.push({
        name: `speed-up of ${ours} over ${theirs}, ${size}`,
        value: round(median.get(theirs)! / median.get(ours)!, 2),
        unit: 'x',
      });
  };
  for (const [size, buf] of bodies) {
    // The rewrite must produce what the naive way produces, or the comparison is meaningless.
    const spliced = rewriteRequest(buf, peekRequest(buf), PLAN);
    expect(JSON.parse(spliced.toString())).toEqual(JSON.parse(parseEditStringify(buf).toString()));
    const speedUp = measure(size, buf, [...methods, ...estimateMethods(buf, true)]);
    speedUp('peekRequest', 'JSON.parse');
    speedUp('peekRequest + rewriteRequest', 'JSON.parse + edit + JSON.stringify');
  }
  const shapes = otherShapes();
  for (const [shape, buf] of shapes) {
    measure(shape, buf, [...peekMethods, ...estimateMethods(buf, false)])(
      'peekRequest',
      'JSON.parse',
    );
  }
  writeResult({
    scenario: 'body',
    title:
      'Body handling: single-pass peek, prompt-token estimate and splice rewrite against JSON.parse / JSON.stringify',
    figures,
    runs,
    notes: [
      `Bodies: ${bodies.map(([n, b]) => `${n} = ${b.length} bytes`).join(', ')}; chat turns of mixed ASCII and non-ASCII text, generated from a fixed seed. The peek and the estimate are also timed on other shapes: ${shapes.map(([n, b]) => `${n} = ${b.length} bytes`).join(', ')}.`,
      `The prompt-token estimate (estimatePromptTokens: ceil(code points of the string values in messages / 4) for chat, the prompt's for completions; one pass over the span, no allocation) is timed on its own with the body's peek done beforehand, and for the three chat bodies also after the peek, as the gateway runs it. Estimates: ${[...bodies, ...shapes].map(([n, b]) => `${n} = ${((p) => estimatePromptTokens(b, p, endpointOf(p)))(peekRequest(b))} tokens`).join(', ')}.`,
      'The rewrite puts the instruction in front of the leading system message\'s text (the default, prepend); "appended to the system prompt" puts it after that text. Never a second system message, which many chat templates refuse.',
      'JSON.parse is timed on the raw bytes as the gateway would need it (buf.toString() included); the naive rewrite parses, puts the instruction in front of the system prompt, scales max_tokens, stringifies and encodes to bytes, which is the same edit as rewriteRequest (checked).',
      `Time: median per call over batches of ~0.2 ms after a warm-up, ${MEASURE_MS} ms of batches per measurement, ${REPEATS} interleaved repeats (runs show their spread; figures are their median). Allocated: JS heap + ArrayBuffer growth across one call after a full GC, median of 15 calls, less the same measured around an empty call.`,
    ],
  });
  // 33 measurements of ~4 s each: more than the bench config's 180 s default on a slow machine.
}, 400_000);

/** A job's fields besides its body, as the gateway sends them (libs/protocol's JobPayload). */
const JOB_FIELDS = {
  v: 1,
  path: '/v1/chat/completions',
  stream: true,
  replica: 'gw-0123456789',
  enqueuedAt: 1_764_000_000_000,
  deadline: 1_764_000_060_000,
  priority: 0,
  promptTokens: 1234,
};

/**
 * The body's way from the gateway's bytes to the bytes undici sends, through BullMQ's JSON job
 * data (BullMQ stringifies `data` on add and parses it when a worker takes the job), three
 * ways: as a string field (today), as a base64 field, and as raw bytes beside the job (a Redis
 * key of its own: ioredis writes a Buffer argument as is, and reading it back copies it once).
 */
const transports: Array<[string, (buf: Buffer) => unknown]> = [
  [
    'string field (today)',
    (buf) => {
      const data = JSON.stringify({ ...JOB_FIELDS, body: buf.toString('utf8') });
      return Buffer.from((JSON.parse(data) as { body: string }).body);
    },
  ],
  [
    'base64 field',
    (buf) => {
      const data = JSON.stringify({ ...JOB_FIELDS, body64: buf.toString('base64') });
      return Buffer.from((JSON.parse(data) as { body64: string }).body64, 'base64');
    },
  ],
  [
    'raw bytes in a key of their own',
    (buf) => {
      JSON.parse(JSON.stringify(JOB_FIELDS));
      return Buffer.from(buf);
    },
  ],
];

it('times the ways a body can travel in the job: string field, base64 field, a key of its own', () => {
  const figures: Figure[] = [];
  const runs: NonNullable<ScenarioResult['runs']> = [];
  const sizes: Array<[string, Buffer]> = [
    ['1 KiB', chatBody(1 << 10, 21)],
    ['64 KiB', chatBody(64 << 10, 22)],
    ['1 MiB', chatBody(1 << 20, 23)],
  ];
  for (const [size, buf] of sizes) {
    for (const [name, fn] of transports)
      expect(Buffer.compare(fn(buf) as Buffer, buf), `${name} gives the bytes back`).toBe(0);
    const median = timeInterleaved(transports, buf, size, runs);
    for (const [name] of transports)
      figures.push({
        name: `time per request: ${name}, ${size}`,
        value: round(median.get(name)!, 4),
        unit: 'ms',
      });
  }
  writeResult({
    scenario: 'body-transport',
    title:
      "The request body's way through BullMQ's job data: string field, base64 field, raw bytes in a key of their own",
    figures,
    runs,
    notes: [
      `Bodies: ${sizes.map(([n, b]) => `${n} = ${b.length} bytes`).join(', ')}; the chat bodies of the body scenario. Each way is timed from the gateway's Buffer to the Buffer undici sends, in this process: the JSON job data stringified (the gateway's add) and parsed (the worker's take), and the body encoded, decoded or copied.`,
      'Not in these figures: Redis and the socket (the same bytes for a string and a raw key; a third more for base64), and what a key of its own adds: one more command to write it (inside the admission transaction, no round trip) and one to read it back in the dispatcher before the engine call (a round trip), and its removal. docs/performance.md weighs them.',
      `Time: median per call over batches of ~0.2 ms after a warm-up, ${MEASURE_MS} ms of batches per measurement, ${REPEATS} interleaved repeats.`,
    ],
  });
}, 120_000);
