// Several engines and several pools from a SLUICE_CONFIG file, behind one dispatcher and one
// gateway: every engine keeps its own cap, a pool spreads its requests over its engines, and
// a pool whose engine is full holds only its own requests.
import { execFile } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  eventually,
  queuedJobs,
  sluiceBin,
  startDispatcher,
  startEngineSim,
  startGateway,
  startRedis,
  type SluiceProcess,
  type TestEngineSim,
  type TestRedis,
} from '../support/index.ts';

let redis: TestRedis;
/** Pool `chat`: engines a (cap 2) and b (cap 3). Pool `code`: engine c (cap 1). */
let sims: Record<'a' | 'b' | 'c', TestEngineSim>;
let dispatcher: SluiceProcess;
let gateway: SluiceProcess;
let client: Redis;
let dir: string;
let env: Record<string, string>;

// Each answer takes some steps, and decoding is slow enough that a stream with no end holds
// its slot until its client leaves.
const simArgs = (model: string) => [
  '--profile',
  'instant',
  '--model',
  model,
  '--max-num-seqs',
  '64',
  '--decode-seconds-per-sequence',
  '0.002',
];

beforeAll(async () => {
  redis = await startRedis();
  const [a, b, c] = await Promise.all([
    startEngineSim(simArgs('chat')),
    startEngineSim(simArgs('chat')),
    startEngineSim(simArgs('code')),
  ]);
  sims = { a: a!, b: b!, c: c! };
  dir = mkdtempSync(join(tmpdir(), 'sluice-pools-'));
  const config = join(dir, 'sluice.yaml');
  writeFileSync(
    config,
    [
      'pools:',
      '  - name: chat',
      '    models: [chat]',
      '    engines:',
      `      - { url: "${sims.a.url}", name: a, maxInflight: 2 }`,
      `      - { url: "${sims.b.url}", name: b, maxInflight: 3 }`,
      '  - name: code',
      '    models: [code]',
      '    engines:',
      `      - { url: "${sims.c.url}", name: c, maxInflight: 1 }`,
      '',
    ].join('\n'),
  );
  env = {
    REDIS_URL: redis.url,
    SLUICE_CONFIG: config,
    VLLM_MAX_QUEUE_DEPTH: '100',
    // One scrape at start-up (idle engines), then none while the tests run: these tests are
    // about the in-flight caps. A scrape mid-burst may rightly hold an engine below its cap
    // (requests released while it was on the wire count as traffic that bypassed the broker;
    // gauges.test.ts covers that), which would make "filled to its cap" a matter of timing.
    ENGINE_SCRAPE_INTERVAL_MS: '60000',
  };
  dispatcher = await startDispatcher(env);
  gateway = await startGateway(env);
  client = new Redis(redis.url);
});

afterAll(async () => {
  await client?.quit();
  await gateway?.stop();
  await dispatcher?.stop();
  await Promise.all(Object.values(sims ?? {}).map((s) => s.stop()));
  await redis?.stop();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

function ask(
  model: string,
  content: string,
  extra: Record<string, unknown> = {},
  signal?: AbortSignal,
) {
  return fetch(`${gateway.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model, messages: [{ role: 'user', content }], ...extra }),
    signal,
  });
}

describe('a pool of two engines and a pool of one', () => {
  it('spreads a burst over both engines of a pool, each held to its own cap', async () => {
    const before = {
      a: (await sims.a.state()).receivedTotal as number,
      b: (await sims.b.state()).receivedTotal as number,
    };
    const answers = await Promise.all(
      Array.from({ length: 40 }, async (_, i) => {
        const res = await ask('chat', `burst ${i}`, { max_tokens: 40, ignore_eos: true });
        const body = (await res.json()) as { choices?: unknown[] };
        return { status: res.status, engine: res.headers.get('x-sluice-engine'), body };
      }),
    );
    expect(answers.map((a) => a.status)).toEqual(answers.map(() => 200));
    expect(answers.every((a) => a.body.choices?.length === 1)).toBe(true);
    const served = { a: 0, b: 0 };
    for (const { engine } of answers) served[engine as 'a' | 'b'] += 1;
    expect(served.a + served.b).toBe(40);
    const [stateA, stateB, stateC] = await Promise.all([
      sims.a.state(),
      sims.b.state(),
      sims.c.state(),
    ]);
    // The header names the engine that answered: each engine saw exactly those requests.
    expect((stateA.receivedTotal as number) - before.a).toBe(served.a);
    expect((stateB.receivedTotal as number) - before.b).toBe(served.b);
    expect(stateC.receivedTotal).toBe(0);
    // Each engine was filled to its own cap and never beyond it.
    expect(stateA.peakRequests).toBe(2);
    expect(stateB.peakRequests).toBe(3);
  });

  it("queues a pool's requests while its engine is full, and serves the other pool meanwhile", async () => {
    const blocker = new AbortController();
    const held = await ask(
      'code',
      'holds engine c',
      { stream: true, max_tokens: 100000, ignore_eos: true },
      blocker.signal,
    );
    expect(held.status).toBe(200);
    await eventually(
      async () => ((await sims.c.state()).running === 1 ? true : undefined),
      'the stream to hold engine c',
    );
    const waiting = ask('code', 'waits for engine c', { max_tokens: 4 });
    await eventually(
      async () => ((await queuedJobs(client, 'sluice', 'code')) === 1 ? true : undefined),
      'the second code request to be queued',
    );
    // Pool chat is not held up by pool code's full engine.
    const chat = await ask('chat', 'not held up', { max_tokens: 4 });
    expect(chat.status).toBe(200);
    expect(await queuedJobs(client, 'sluice', 'code')).toBe(1);
    blocker.abort();
    const released = await waiting;
    expect(released.status).toBe(200);
    expect(released.headers.get('x-sluice-engine')).toBe('c');
    expect((await sims.c.state()).peakRequests).toBe(1);
  });

  it('`sluice status --json` shows both pools with their engines and caps', async () => {
    type Status = Array<{
      pool: string;
      stats?: { leader: string; engines: Array<{ name: string; cap: number; health?: string }> };
    }>;
    const status = await eventually(async () => {
      const { stdout } = await promisify(execFile)(
        process.execPath,
        [sluiceBin, 'status', '--json'],
        {
          env: { ...process.env, ...env },
        },
      );
      const pools = JSON.parse(stdout) as Status;
      return pools.every((p) => p.stats?.engines.every((e) => e.health === 'healthy'))
        ? pools
        : undefined;
    }, 'both pools published with healthy engines');
    expect(
      status.map((p) => ({
        pool: p.pool,
        engines: p.stats!.engines.map((e) => [e.name, e.cap]),
      })),
    ).toEqual([
      {
        pool: 'chat',
        engines: [
          ['a', 2],
          ['b', 3],
        ],
      },
      { pool: 'code', engines: [['c', 1]] },
    ]);
    expect(new Set(status.map((p) => p.stats!.leader)).size).toBe(1);
  });
});
