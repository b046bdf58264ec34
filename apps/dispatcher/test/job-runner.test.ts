// The job runner on real processes: jobs taken from a real BullMQ queue, an engine simulator,
// reply frames on a real Redis channel. Each test takes one job and runs it.
import { defaultDegradation } from '@sluice/config';
import { dispatcherMetrics, Registry } from '@sluice/observability';
import {
  decodeFrame,
  keySpace,
  messageFrames,
  type Frame,
  type JobPayload,
} from '@sluice/protocol';
import { createRedis, redisReady, type Redis } from '@sluice/redis';
import {
  eventually,
  monitorRedis,
  startEngineSim,
  startRedis,
  type TestEngineSim,
  type TestRedis,
} from '@sluice/test/support';
import { Queue, Worker, type Job } from 'bullmq';
import { once } from 'node:events';
import { createServer, type IncomingHttpHeaders } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CancelBook } from '../src/cancels.ts';
import { PoolLoad } from '../src/degrade.ts';
import type { EngineClient, ResponseWatch } from '../src/engine-call.ts';
import { createEngineSlot } from '../src/engine-slot.ts';
import { FairShare } from '../src/fair-share.ts';
import { recordOutcome } from '../src/handover.ts';
import { JobRunner, type JobRunnerDeps } from '../src/job-runner.ts';
import { InflightLedger, type InflightJob } from '../src/ledger.ts';
import { PrefillRate } from '../src/prefill-tracker.ts';
import { RelayHub, type ReplyRelay } from '../src/relay.ts';
import { ReplicaLiveness } from '../src/replicas.ts';

let server: TestRedis;
let sim: TestEngineSim;
let command: Redis;
let bull: Redis;
let subscriber: Redis;
let queue: Queue;
let worker: Worker;
let hub: RelayHub;
const keys = keySpace('runner-test');
const registry = new Registry();
const metrics = dispatcherMetrics(registry);
const cancels = new CancelBook(60_000, Date.now);
const silent = { info: () => {}, warn: () => {}, error: () => {} };

beforeAll(async () => {
  server = await startRedis();
  sim = await startEngineSim(['--profile', 'instant', '--model', 'm']);
  command = createRedis(server.url, { name: 'cmd', role: 'command' });
  bull = createRedis(server.url, { name: 'bull', role: 'bullmq' });
  subscriber = createRedis(server.url, { name: 'sub', role: 'subscriber' });
  await Promise.all([redisReady(command), redisReady(bull), redisReady(subscriber)]);
  // Each test listens for its own replica's frames and makes a runner of its own (whose
  // liveness check listens for reconnects): more listeners than Node's default warning limit.
  subscriber.setMaxListeners(50);
  command.setMaxListeners(50);
  // The pool's real queue name: keys.jobKey and keys.jobBody name this queue's keys.
  queue = new Queue(keys.queueName('p'), { connection: bull, prefix: keys.prefix });
  worker = new Worker(keys.queueName('p'), null, {
    connection: bull,
    prefix: keys.prefix,
    autorun: false,
  });
  await worker.waitUntilReady();
  hub = new RelayHub(command, 1000, Date.now);
});
afterAll(async () => {
  hub?.stop();
  await worker?.close(true);
  await queue?.close();
  await Promise.all([command, bull, subscriber].map((c) => c?.quit().catch(() => {})));
  await sim?.stop();
  await server?.stop();
});

const engine = (url = sim.url) =>
  createEngineSlot(
    { name: 'sim', url, maxInflight: 4, capSource: 'config', lane: 'any' },
    {
      timeouts: { headersTimeoutMs: 10_000, bodyTimeoutMs: 10_000 },
      scrape: { intervalMs: 1000, staleAfterFailures: 3 },
      now: Date.now,
    },
  );

function runner(
  replicas = new ReplicaLiveness(command, keys, 0, 0, Date.now),
  over: Partial<JobRunnerDeps> = {},
) {
  return new JobRunner({
    pool: 'p',
    keys,
    redis: command,
    hub,
    cancels,
    replicas,
    metrics,
    load: new PoolLoad({ ...defaultDegradation, enabled: false }),
    maxParkSeconds: 60,
    log: silent,
    now: Date.now,
    released: () => {},
    ...over,
  });
}

/** The relay hub, except that opening a relay throws. */
function brokenHub(): RelayHub {
  const broken = Object.create(hub) as RelayHub;
  broken.open = () => {
    throw new Error('no reply channel');
  };
  return broken;
}

const prefillRate = new PrefillRate();
const ledger = new InflightLedger({
  pool: 'p',
  metrics,
  prefillRate,
  now: Date.now,
  changed: () => {},
});

let replicas = 0;
/** A job for a fresh replica whose channel the test listens on; alive unless told. */
async function take(
  opts: {
    alive?: boolean;
    maxTokens?: number;
    endCounts?: boolean;
    /** The body goes into a key of its own (as a gateway does for a large one); null: it is lost. */
    bodyInKey?: boolean | null;
    /** The simulator's count of the prompt's tokens (over its max_model_len: a 400). */
    simPromptTokens?: number;
    long?: boolean;
    tenant?: string;
    promptTokens?: number;
    /** The stream ends with the engine's `usage` (`stream_options.include_usage`). */
    includeUsage?: boolean;
    /** More payload fields, as a gateway writes them. */
    more?: Partial<JobPayload>;
    /** Another engine than the simulator. */
    engineUrl?: string;
    /** False: a non-streamed request (body and payload). */
    stream?: boolean;
  } = {},
) {
  const replica = `r${(replicas += 1)}`;
  if (opts.alive !== false) await command.set(keys.replicaAlive(replica), '1', 'PX', 60_000);
  const body = JSON.stringify({
    model: 'm',
    messages: [{ role: 'user', content: 'hi' }],
    stream: opts.stream ?? true,
    max_tokens: opts.maxTokens ?? 3,
    ignore_eos: true,
    ...(opts.simPromptTokens === undefined ? {} : { sim_prompt_tokens: opts.simPromptTokens }),
    ...(opts.includeUsage ? { stream_options: { include_usage: true } } : {}),
  });
  const payload: JobPayload = {
    v: 1,
    ...(opts.bodyInKey === undefined ? { body } : { bodyInKey: true as const }),
    path: '/v1/chat/completions',
    stream: opts.stream ?? true,
    replica,
    enqueuedAt: Date.now(),
    deadline: Date.now() + 60_000,
    priority: 0,
    endCounts: opts.endCounts ?? true,
    ...(opts.tenant === undefined ? {} : { tenant: opts.tenant }),
    ...(opts.promptTokens === undefined ? {} : { promptTokens: opts.promptTokens }),
    ...opts.more,
  };
  const added = await queue.add('job', payload);
  if (opts.bodyInKey) await command.set(keys.jobBody('p', added.id!), Buffer.from(body));
  const token = `token-${replica}`;
  const job = (await worker.getNextJob(token, { block: false })) as Job;
  const frames: Frame[] = [];
  const channel = keys.replyChannel(replica);
  subscriber.on('messageBuffer', (ch: Buffer, message: Buffer) => {
    if (ch.toString() === channel) frames.push(...messageFrames(message).map(decodeFrame));
  });
  await subscriber.subscribe(channel);
  const entry = ledger.begin(job, token, engine(opts.engineUrl), payload, opts.long ?? false);
  return { job, entry, frames, replica };
}

/** Runs `entry` as the release loop does: the run, then its outcome recorded, then the slot freed. */
async function runAndRecord(entry: InflightJob, run = runner()) {
  const outcome = await run.run(entry);
  if (outcome !== undefined) await recordOutcome(worker, entry, outcome, false);
  ledger.complete(entry);
  return outcome;
}

/** The value of `metric`'s series with `labels` (0 when it has none yet). */
async function count(
  metric: { get(): Promise<{ values: { labels: object; value: number }[] }> },
  labels: Record<string, string>,
): Promise<number> {
  const match = (l: object) =>
    Object.entries(labels).every(([k, v]) => (l as Record<string, unknown>)[k] === v);
  return (await metric.get()).values.find((v) => match(v.labels))?.value ?? 0;
}

const skipped = (reason: string) => count(metrics.skipped, { reason });

/** The leader's fair share of pool `p`, with the runner's metrics, as pool-dispatcher.ts makes it. */
function fairShareOf(tenant: string): FairShare {
  return new FairShare({
    pool: 'p',
    tenants: [{ name: tenant, keySha256: ['c'.repeat(64)], weight: 1, maxPriority: 0 }],
    keys,
    redis: command,
    bull,
    queue,
    lease: { key: keys.lease('p'), owner: 'leader' },
    metrics,
    log: silent,
  });
}

describe('job runner', () => {
  it('runs a job on its engine, relays start, head, data and end, and completes the job', async () => {
    const { job, entry, frames } = await take();
    await runAndRecord(entry);
    // Frames reach the subscriber after the run has published them.
    await eventually(() => frames.some((f) => f.type === 'end'), 'the end frame');
    const types = frames.map((f) => f.type);
    expect(types[0]).toBe('start');
    expect(types[1]).toBe('head');
    expect(types.at(-1)).toBe('end');
    expect(types).toContain('data');
    // Three tokens streamed without usage: counted from the events, the role's not among them.
    expect(frames.at(-1)).toMatchObject({ type: 'end', info: { completionTokens: 3 } });
    expect(await queue.getJobState(job.id!)).toBe('completed');
  });

  it('runs a job whose body its gateway put in a key of its own, and deletes the key', async () => {
    const { job, entry, frames } = await take({ bodyInKey: true, maxTokens: 5 });
    expect(job.data).not.toHaveProperty('body');
    await runAndRecord(entry);
    expect(await command.exists(keys.jobBody('p', job.id!))).toBe(0);
    await eventually(() => frames.some((f) => f.type === 'end'), 'the end frame');
    // The engine streamed the 5 tokens that body asks for.
    expect(frames.at(-1)).toMatchObject({ type: 'end', info: { completionTokens: 5 } });
    expect(await queue.getJobState(job.id!)).toBe('completed');
  });

  it('answers an error frame and runs nothing when the body in its key is gone', async () => {
    const before = (await sim.state()).receivedTotal as number;
    const missing = await skipped('body_missing');
    const { job, entry, frames } = await take({ bodyInKey: null });
    await runAndRecord(entry);
    await eventually(() => frames.some((f) => f.type === 'error'), 'the error frame');
    expect(frames).toEqual([
      expect.objectContaining({
        type: 'error',
        info: {
          code: 'internal_error',
          message: 'request not started: its body is missing from Redis',
        },
      }),
    ]);
    expect(await queue.getJobState(job.id!)).toBe('failed');
    expect(await skipped('body_missing')).toBe(missing + 1);
    expect((await sim.state()).receivedTotal).toBe(before);
  });

  it('sends no counts in the end frame of a job from a gateway that does not read them', async () => {
    const { entry, frames } = await take({ endCounts: false });
    await runAndRecord(entry);
    await eventually(() => frames.some((f) => f.type === 'end'), 'the end frame');
    expect(frames.at(-1)).toEqual({ type: 'end', jobId: entry.id, seq: frames.length - 1 });
  });

  it("publishes the end frame before BullMQ's completion of the job reaches Redis", async () => {
    // MONITOR lists commands in the order Redis runs them: the client's reply must not wait
    // behind the completion script.
    const monitor = await monitorRedis(server.url);
    const seen: string[][] = [];
    monitor.on('monitor', (_time: string, args: string[]) => seen.push(args));
    try {
      const { job, entry, replica } = await take();
      await runAndRecord(entry);
      const jobKey = keys.jobKey('p', job.id!);
      const isCompletion = (args: string[]) =>
        /^eval(sha)?$/i.test(args[0]!) && args.includes(jobKey) && args.includes('completed');
      const completion = await eventually(() => {
        const at = seen.findIndex(isCompletion);
        return at < 0 ? undefined : at;
      }, 'the completion in MONITOR');
      const channel = keys.replyChannel(replica);
      const lastPublish = seen.findLastIndex(
        (args) => args[0]!.toLowerCase() === 'publish' && args[1] === channel,
      );
      expect(lastPublish).toBeGreaterThanOrEqual(0);
      expect(lastPublish).toBeLessThan(completion);
      expect(await queue.getJobState(job.id!)).toBe('completed');
    } finally {
      monitor.disconnect();
    }
  });

  it('sends the engine the request id, trace context and data-parallel rank its gateway put in the job', async () => {
    // The simulator does not keep headers: a stand-in engine that does, answering as vLLM would.
    const received: IncomingHttpHeaders[] = [];
    const stand = createServer((req, res) => {
      received.push(req.headers);
      req.resume();
      req.on('end', () =>
        res.writeHead(200, { 'content-type': 'text/event-stream' }).end('data: [DONE]\n\n'),
      );
    });
    stand.listen(0, '127.0.0.1');
    await once(stand, 'listening');
    try {
      const url = `http://127.0.0.1:${(stand.address() as AddressInfo).port}`;
      const traceparent = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01';
      const { job, entry } = await take({
        engineUrl: url,
        more: {
          requestId: 'client-req-42',
          traceparent,
          tracestate: 'congo=t61rcWkgMzE',
          dataParallelRank: '1',
        },
      });
      expect(await runAndRecord(entry)).toBe('ok');
      expect(received).toHaveLength(1);
      expect(received[0]).toMatchObject({
        'x-request-id': 'client-req-42',
        traceparent,
        tracestate: 'congo=t61rcWkgMzE',
        'x-data-parallel-rank': '1',
      });
      expect(await queue.getJobState(job.id!)).toBe('completed');
    } finally {
      stand.closeAllConnections();
      stand.close();
    }
  });

  it('skips a job whose gateway replica is gone: the engine never sees it, the job fails', async () => {
    const before = (await sim.state()).receivedTotal as number;
    const gone = await skipped('client_gone');
    const { job, entry } = await take({ alive: false });
    const infos: { o: object; m: string }[] = [];
    const log = { ...silent, info: (o: object, m: string) => infos.push({ o, m }) };
    await runAndRecord(entry, runner(undefined, { log }));
    expect(await queue.getJobState(job.id!)).toBe('failed');
    // Its client is told nothing (no replica holds it): the dispatcher's log says why it went.
    expect(infos).toEqual([
      {
        o: { jobId: job.id, pool: 'p', reason: 'client_gone' },
        m: 'job failed without running',
      },
    ]);
    // Its lock went with the failure: a lock renewal must not take it for lost.
    expect(entry.recorded).toBe(true);
    expect(await skipped('client_gone')).toBe(gone + 1);
    expect((await sim.state()).receivedTotal).toBe(before);
  });

  it('counts an engine refusal (4xx) as client_error, not ok, completes its job, and measures no prefill', async () => {
    const refusals = await count(metrics.completed, { outcome: 'client_error' });
    const oks = await count(metrics.completed, { outcome: 'ok' });
    // A long streamed prompt over the engine's max_model_len: refused at once, 400.
    const { job, entry, frames } = await take({ long: true, simPromptTokens: 1_000_000 });
    expect(await runAndRecord(entry)).toBe('ok');
    await eventually(() => frames.some((f) => f.type === 'end'), 'the end frame');
    expect(frames.find((f) => f.type === 'head')).toMatchObject({ info: { status: 400 } });
    expect(await count(metrics.completed, { outcome: 'client_error' })).toBe(refusals + 1);
    expect(await count(metrics.completed, { outcome: 'ok' })).toBe(oks);
    // The answer was delivered whole: BullMQ completes the job, as for any answer.
    expect(await queue.getJobState(job.id!)).toBe('completed');
    // Its instant first byte is no prefill: no rate from it (before the fix, 1,000,000
    // tokens in a few ms).
    expect(prefillRate.value).toBeUndefined();
    expect(entry.engine.longInPrefill).toBe(0);
  });

  it('charges a tenant nothing for a job the runner skips, and charges the one it sends', async () => {
    const tenant = 'skipped-tenant';
    const fairShare = fairShareOf(tenant);
    const tenantCounts = async () => [
      await count(metrics.tenantReleased, { tenant }),
      await count(metrics.tenantTokens, { tenant, kind: 'input' }),
      fairShare.view()[tenant]!.virtualTokens,
    ];
    const run = runner(undefined, { fairShare });
    // The release loop charges the tenant as it lets the job go (release-loop.ts, `release`).
    const gone = await take({ alive: false, tenant, promptTokens: 6 });
    fairShare.released(gone.entry.id, gone.entry.payload);
    await runAndRecord(gone.entry, run);
    expect(await queue.getJobState(gone.job.id!)).toBe('failed');
    fairShare.ended(gone.entry.payload);
    expect(await tenantCounts()).toEqual([0, 0, 0]);
    expect(fairShare.view()[tenant]!.inflight).toBe(0);

    const sent = await take({ tenant, promptTokens: 6 });
    fairShare.released(sent.entry.id, sent.entry.payload);
    expect(await runAndRecord(sent.entry, run)).toBe('ok');
    const [released, input, virtualTokens] = await tenantCounts();
    expect([released, input]).toEqual([1, 6]);
    // Its input, and its output (weighted twice) as it streamed.
    expect(virtualTokens).toBe(6 + 2 * 3);
  });

  it("replaces a tenant's estimated input charge with the engine's prompt count", async () => {
    const tenant = 'counted-tenant';
    const fairShare = fairShareOf(tenant);
    const run = runner(undefined, { fairShare });
    const sent = await take({ tenant, promptTokens: 6, simPromptTokens: 40, includeUsage: true });
    fairShare.released(sent.entry.id, sent.entry.payload);
    expect(fairShare.view()[tenant]!.virtualTokens).toBe(6);
    expect(await runAndRecord(sent.entry, run)).toBe('ok');
    const end = await eventually(() => sent.frames.find((f) => f.type === 'end'), 'the end frame');
    expect(end).toMatchObject({ info: { promptTokens: 40, completionTokens: 3 } });
    // The engine's 40 prompt tokens, not the estimate, and the output weighted twice.
    expect(fairShare.view()[tenant]!.virtualTokens).toBe(40 + 2 * 3);
  });

  it("settles a non-streamed job's reserved output with the engine's usage", async () => {
    const tenant = 'whole-tenant';
    const fairShare = fairShareOf(tenant);
    const run = runner(undefined, { fairShare });
    // The client's limit (the payload's) is 50; the engine generates 3.
    const sent = await take({
      tenant,
      stream: false,
      promptTokens: 6,
      simPromptTokens: 40,
      more: { maxTokens: 50 },
    });
    fairShare.released(sent.entry.id, sent.entry.payload);
    expect(fairShare.view()[tenant]!.virtualTokens).toBe(6 + 2 * 50);
    expect(await runAndRecord(sent.entry, run)).toBe('ok');
    const end = await eventually(() => sent.frames.find((f) => f.type === 'end'), 'the end frame');
    expect(end).toMatchObject({ info: { promptTokens: 40, completionTokens: 3 } });
    // The engine's counts replace both the estimate and the reservation.
    expect(fairShare.view()[tenant]!.virtualTokens).toBe(40 + 2 * 3);
    expect(await count(metrics.tenantTokens, { tenant, kind: 'output' })).toBe(3);
  });

  it("keeps a non-streamed job's reservation charged when its call is cancelled before the answer", async () => {
    const tenant = 'abandoning-tenant';
    const fairShare = fairShareOf(tenant);
    // An engine that takes the request and generates for as long as it is left to.
    const requests: Array<() => void> = [];
    const stand = createServer((req) => {
      req.resume();
      req.on('end', () => requests.push(() => req.socket.destroy()));
    });
    stand.listen(0, '127.0.0.1');
    await once(stand, 'listening');
    try {
      const url = `http://127.0.0.1:${(stand.address() as AddressInfo).port}`;
      const sent = await take({
        tenant,
        stream: false,
        promptTokens: 6,
        engineUrl: url,
        more: { maxTokens: 200 },
      });
      fairShare.released(sent.entry.id, sent.entry.payload);
      const running = runAndRecord(sent.entry, runner(undefined, { fairShare }));
      await eventually(() => requests.length === 1, 'the engine to have the request');
      // Its client left while the engine generated: the answer never comes, nor its usage.
      cancels.cancel(sent.job.id!, 'client went');
      expect(await running).toBe('cancelled');
      fairShare.ended(sent.entry.payload);
      expect(fairShare.view()[tenant]).toMatchObject({ virtualTokens: 6 + 2 * 200, inflight: 0 });
      expect(await count(metrics.tenantTokens, { tenant, kind: 'output' })).toBe(0);
    } finally {
      for (const close of requests) close();
      stand.close();
    }
  });

  it('gives back the reservation of a non-streamed job the engine refused (4xx), and of one skipped', async () => {
    const tenant = 'refused-tenant';
    const fairShare = fairShareOf(tenant);
    const run = runner(undefined, { fairShare });
    // A prompt over the engine's max_model_len: refused at once, 400, nothing generated.
    const refused = await take({
      tenant,
      stream: false,
      promptTokens: 6,
      simPromptTokens: 1_000_000,
      more: { maxTokens: 200 },
    });
    fairShare.released(refused.entry.id, refused.entry.payload);
    expect(await runAndRecord(refused.entry, run)).toBe('ok');
    expect(fairShare.view()[tenant]!.virtualTokens).toBe(6);
    // Skipped before its engine call (its client's replica is gone): nothing stays charged.
    const gone = await take({ alive: false, tenant, stream: false, more: { maxTokens: 200 } });
    fairShare.released(gone.entry.id, gone.entry.payload);
    expect(fairShare.view()[tenant]!.virtualTokens).toBe(6 + 2 * 200);
    await runAndRecord(gone.entry, run);
    expect(fairShare.view()[tenant]!.virtualTokens).toBe(6);
    // An engine never reached (restarting: connection refused) generated nothing either.
    const unreached = await take({
      tenant,
      stream: false,
      engineUrl: 'http://127.0.0.1:1',
      more: { maxTokens: 200 },
    });
    fairShare.released(unreached.entry.id, unreached.entry.payload);
    expect(fairShare.view()[tenant]!.virtualTokens).toBe(6 + 2 * 200);
    await runAndRecord(unreached.entry, run);
    expect(fairShare.view()[tenant]!.virtualTokens).toBe(6);
  });

  it('skips a job cancelled before its run started', async () => {
    const before = (await sim.state()).receivedTotal as number;
    const { job, entry } = await take();
    cancels.cancel(job.id!, 'client went');
    await runAndRecord(entry);
    expect(await queue.getJobState(job.id!)).toBe('failed');
    expect((await sim.state()).receivedTotal).toBe(before);
  });

  it('runs a job whose replica cannot be checked (its Redis is unreachable) and never rejects', async () => {
    const other = await startRedis();
    const gone = createRedis(other.url, { name: 'gone', role: 'command' });
    gone.on('error', () => {});
    await redisReady(gone);
    await other.stop();
    try {
      const { job, entry, frames } = await take();
      await expect(
        runAndRecord(entry, runner(new ReplicaLiveness(gone, keys, 0, 0, Date.now))),
      ).resolves.toBe('ok');
      await eventually(() => frames.some((f) => f.type === 'end'), 'the end frame');
      expect(await queue.getJobState(job.id!)).toBe('completed');
    } finally {
      gone.disconnect();
    }
  });

  it('tells the client dispatcher_lost and frees the engine slot when its job is lost mid-stream', async () => {
    const { job, entry, frames } = await take({ maxTokens: 100_000 });
    const run = runAndRecord(entry);
    await eventually(() => frames.some((f) => f.type === 'data'), 'the first data frame');
    cancels.cancel(job.id!, 'the job lock was lost', 'dispatcher_lost');
    expect(await run).not.toBe('ok');
    const error = await eventually(() => frames.find((f) => f.type === 'error'), 'the error frame');
    expect(error.type === 'error' && error.info.code).toBe('dispatcher_lost');
    expect(await queue.getJobState(job.id!)).toBe('failed');
    await eventually(async () => (await sim.state()).running === 0, 'the engine to drop it');
  });

  it('tells the client dispatcher_lost when its job is lost before the engine call', async () => {
    const before = (await sim.state()).receivedTotal as number;
    const { job, entry, frames } = await take();
    cancels.cancel(job.id!, 'the job lock was lost', 'dispatcher_lost');
    await runAndRecord(entry);
    const error = await eventually(() => frames.find((f) => f.type === 'error'), 'the error frame');
    expect(error.type === 'error' && error.info.code).toBe('dispatcher_lost');
    expect((await sim.state()).receivedTotal).toBe(before);
  });

  it('leaves the cancel book however the run ends, a throw after its registration included', async () => {
    const { job, entry } = await take();
    expect(await runAndRecord(entry, runner(undefined, { hub: brokenHub() }))).toBeUndefined();
    // Not running any more: a cancel now is one for a job not released.
    expect(cancels.cancel(job.id!, 'client went')).toBe(false);
  });

  it('fails a job taken past its deadline even when its park_timeout frame cannot be made', async () => {
    const errors: string[] = [];
    const log = { info() {}, warn() {}, error: (_o: object, m: string) => errors.push(m) };
    const { job, entry, replica } = await take();
    ledger.complete(entry);
    const expiring = runner(undefined, { hub: brokenHub(), log }).expire(job, `token-${replica}`, {
      ...entry.payload,
      deadline: Date.now() - 1000,
    });
    await expect(expiring).resolves.toBeUndefined();
    expect(errors).toEqual(['sending an error frame failed']);
    expect(await queue.getJobState(job.id!)).toBe('failed');
    expect((await queue.getJob(job.id!))?.failedReason).toBe('past_deadline');
  });

  it("ignores an engine's usage count that is not a token count: logged once, never charged or sent", async () => {
    const warnings: Array<{ o: object; m: string }> = [];
    const log = { info() {}, warn: (o: object, m: string) => warnings.push({ o, m }), error() {} };
    const charged: number[] = [];
    const fairShare = {
      started: () => {},
      output: (_tenant: string | undefined, tokens: number) => charged.push(tokens),
    } as unknown as FairShare;
    const huge = '1'.padEnd(400, '0');
    const { entry, frames } = await take();
    Object.assign(entry.payload, { tenant: 't' });
    // An engine whose stream ends with a usage no double holds (read as Infinity).
    await entry.engine.client.close();
    entry.engine.client = {
      call: (
        _path: string,
        _body: unknown,
        relay: ReplyRelay,
        _c: unknown,
        watch: ResponseWatch,
      ) => {
        relay.head({ status: 200, contentType: 'text/event-stream' });
        for (const chunk of [
          'data: {"choices":[{"delta":{"content":"a"}}]}\n\n',
          `data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":${huge}}}\n\n`,
        ]) {
          relay.data(Buffer.from(chunk));
          watch.data?.(Buffer.from(chunk));
        }
        relay.end(watch.end?.());
        return Promise.resolve('ok');
      },
      close: async () => {},
    } as unknown as EngineClient;
    expect(await runAndRecord(entry, runner(undefined, { log, fairShare }))).toBe('ok');
    const end = await eventually(() => frames.find((f) => f.type === 'end'), 'the end frame');
    // The gateway gets the stream's own count, which it can read.
    expect(end).toMatchObject({ info: { completionTokens: 2 } });
    expect(end.type === 'end' && end.info?.promptTokens).toBeUndefined();
    expect(charged.every((n) => Number.isSafeInteger(n))).toBe(true);
    expect(charged.reduce((a, b) => a + b, 0)).toBe(2);
    expect(warnings).toEqual([
      {
        o: expect.objectContaining({ jobId: entry.id, usage: { completionTokens: huge } }),
        m: 'engine usage count is not a token count: ignored',
      },
    ]);
  });
});
