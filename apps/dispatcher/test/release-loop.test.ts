// The release loop on a real BullMQ queue, with the real job runner and relay and an engine
// whose calls the test ends: a job that cannot be run (its data not even JSON included) is
// failed with nothing else lost, whether the loop's own take got it or a run's end handed its
// slot to it (moveToFinished with fetchNext), a throw while placing a job handed over is
// caught with the slot freed, and a job a dead dispatcher left is failed with its client told.
import type { GatePolicy } from '@sluice/admission';
import { defaultDegradation, type PoolConfig } from '@sluice/config';
import { dispatcherMetrics, Registry } from '@sluice/observability';
import { decodeFrame, messageFrames, type Frame, type JobPayload } from '@sluice/protocol';
import { createRedis, quietWorkerScripts, redisReady, waitingAfterTake } from '@sluice/redis';
import { eventually } from '@sluice/test/support';
import type { Job } from 'bullmq';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CancelBook } from '../src/cancels.ts';
import { PoolLoad } from '../src/degrade.ts';
import type { EngineClient } from '../src/engine-call.ts';
import { createEngineSlot } from '../src/engine-slot.ts';
import { Holding } from '../src/holding.ts';
import { PoolWorker } from '../src/job-build.ts';
import { JobRunner } from '../src/job-runner.ts';
import { InflightLedger } from '../src/ledger.ts';
import { PrefillRate } from '../src/prefill-tracker.ts';
import { RelayHub, type ReplyRelay } from '../src/relay.ts';
import { ReleaseLoop } from '../src/release-loop.ts';
import { ReplicaLiveness } from '../src/replicas.ts';
import { startQueueFixture, type QueueFixture } from './queue-fixture.ts';

const longPrompts = {
  thresholdTokens: 8192,
  maxShare: 0.5,
  maxInPrefill: 1,
  agingSeconds: 60,
  kvFit: true,
};
const pool = { name: 'p', longPrompts } as PoolConfig;
const policy = { kvThreshold: 0.9, failMode: 'open', maxGaugeAgeMs: 5000 } as const;

let fx: QueueFixture;
beforeAll(async () => {
  fx = await startQueueFixture('release-loop-test');
  // The take and completion as the dispatcher runs them: the take answers what it left waiting.
  await fx.worker.waitUntilReady();
  quietWorkerScripts(fx.bull);
  await fx.redis.set(fx.keys.replicaAlive('gw1'), '1');
});
afterAll(async () => {
  await fx?.close();
});

/** The real runner, keeping each job it failed without running, and when that reached Redis. */
class RecordingRunner extends JobRunner {
  readonly discarded: Array<{ id: string; reason: string; done: Promise<void> }> = [];
  private discardWaiters: Array<() => void> = [];

  override discard(job: Job, token: string, reason: string): Promise<void> {
    const done = super.discard(job, token, reason);
    this.discarded.push({ id: job.id!, reason, done });
    for (const resolve of this.discardWaiters.splice(0)) resolve();
    return done;
  }

  /** Resolves once `count` jobs were failed without running. */
  async discards(count: number): Promise<void> {
    while (this.discarded.length < count)
      await new Promise<void>((resolve) => this.discardWaiters.push(resolve));
  }
}

/** A job the engine got: the test ends its call. */
interface EngineCall {
  jobId: string;
  end(outcome: string): void;
}

/** A leading dispatcher's loop for the fixture's pool, one engine of cap 1. */
function leadingLoop(
  opts: {
    throwOnTaken?: string;
    throwOnHandover?: boolean;
    cap?: number;
    policy?: GatePolicy;
  } = {},
) {
  const metrics = dispatcherMetrics(new Registry());
  if (opts.throwOnHandover)
    metrics.handovers.inc = () => {
      throw new Error('the handover counter broke');
    };
  const errors: Array<{ o: Record<string, unknown>; m: string }> = [];
  const warnings: string[] = [];
  let errorLogged = () => {};
  const logged = new Promise<void>((resolve) => (errorLogged = resolve));
  const log = {
    info() {},
    warn: (_o: object, m: string) => void warnings.push(m),
    error: (o: object, m: string) => {
      errors.push({ o: o as Record<string, unknown>, m });
      errorLogged();
    },
  };
  const engine = createEngineSlot(
    {
      name: 'e',
      url: 'http://127.0.0.1:1',
      maxInflight: opts.cap ?? 1,
      capSource: 'config',
      lane: 'any',
    },
    {
      timeouts: { headersTimeoutMs: 1000, bodyTimeoutMs: 1000 },
      scrape: { intervalMs: 1000, staleAfterFailures: 3 },
      now: Date.now,
    },
  );
  const calls: EngineCall[] = [];
  const callWaiters: Array<(call: EngineCall) => void> = [];
  const started: EngineCall[] = [];
  void engine.client.close();
  engine.client = {
    call: (_path: string, _body: unknown, relay: ReplyRelay) =>
      new Promise((resolve) => {
        const call = { jobId: relay.jobId, end: resolve };
        started.push(call);
        const waiter = callWaiters.shift();
        if (waiter) waiter(call);
        else calls.push(call);
      }),
    close: async () => {},
  } as unknown as EngineClient;
  const nextCall = () =>
    calls.length > 0
      ? Promise.resolve(calls.shift()!)
      : new Promise<EngineCall>((resolve) => callWaiters.push(resolve));

  // The blocked take sleeps at most a second once the test stops leading. The dispatcher's
  // own worker class, as pool-dispatcher.ts makes it (job-build.ts).
  const worker = new PoolWorker(fx.keys.queueName('p'), null, {
    connection: fx.bull,
    prefix: fx.keys.prefix,
    autorun: false,
    drainDelay: 1,
  });
  const hub = new RelayHub(fx.redis, 1000, Date.now);
  let leading = true;
  const ledger = new InflightLedger({
    pool: 'p',
    metrics,
    prefillRate: new PrefillRate(),
    now: Date.now,
    // As pool-dispatcher.ts: a freed slot may let a held job go.
    changed: () => {
      holding.maybePromote();
      loop.wake();
    },
  });
  const holding = new Holding({
    pool: 'p',
    queue: fx.queue,
    redis: fx.redis,
    metrics,
    log,
    longPrompts,
    isLeader: () => leading,
    context: (now) => ({
      engines: [engine],
      policy: longPrompts,
      gate: opts.policy ?? policy,
      now,
    }),
    changed: () => loop.wake(),
    now: Date.now,
  });
  if (opts.throwOnTaken !== undefined) {
    const taken = holding.taken.bind(holding);
    holding.taken = (jobId) => {
      if (jobId === opts.throwOnTaken) throw new Error(`holding broke on ${jobId}`);
      taken(jobId);
    };
  }
  const runner = new RecordingRunner({
    pool: 'p',
    keys: fx.keys,
    redis: fx.redis,
    hub,
    cancels: new CancelBook(60_000, Date.now),
    replicas: new ReplicaLiveness(fx.redis, fx.keys, 0, 0, Date.now),
    metrics,
    load: new PoolLoad({ ...defaultDegradation, enabled: false }),
    maxParkSeconds: 60,
    log,
    now: Date.now,
    released: () => {},
  });
  // The ledger and the holding wake it once it exists: nothing runs before `start`.
  const loop = new ReleaseLoop({
    id: 'd1',
    pool,
    worker,
    engines: [engine],
    policy: opts.policy ?? policy,
    holding,
    ledger,
    runner,
    metrics,
    waitingAfterTake: () => waitingAfterTake(fx.bull, worker.keys.wait!),
    mayTake: () => leading,
    log,
    now: Date.now,
  });
  loop.start();
  const handovers = async () => (await metrics.handovers.get()).values[0]?.value ?? 0;
  return {
    engine,
    ledger,
    runner,
    metrics,
    errors,
    warnings,
    /** Resolves at the first error line. */
    logged,
    nextCall,
    handovers,
    async stop() {
      leading = false;
      loop.wake();
      await loop.stopped();
      // A test that failed may have left a call running.
      for (const call of started) call.end('ok');
      await ledger.idle();
      await worker.close();
      hub.stop();
    },
  };
}

let jobs = 0;
async function add(over: Partial<JobPayload> = {}): Promise<string> {
  const payload: JobPayload = {
    v: 1,
    body: '{"model":"m","prompt":"hi"}',
    path: '/v1/completions',
    stream: false,
    replica: 'gw1',
    enqueuedAt: Date.now(),
    deadline: Date.now() + 60_000,
    priority: 0,
    ...over,
  };
  const jobId = `job-${(jobs += 1)}`;
  await fx.queue.add('c', payload, { jobId });
  return jobId;
}

/**
 * A job whose data is not JSON, as the reviewer made one: its hash's `data` cut short. Added
 * delayed, so that no take gets it before it is cut, then promoted into the queue.
 */
async function addUnparseable(): Promise<string> {
  const jobId = `job-${(jobs += 1)}`;
  const job = await fx.queue.add('c', {}, { jobId, delay: 60_000 });
  await fx.redis.hset(fx.queue.toKey(jobId), 'data', '{"v":1,"trunc');
  await job.promote();
  return jobId;
}

async function failedReason(jobId: string): Promise<string | undefined> {
  expect(await fx.queue.getJobState(jobId)).toBe('failed');
  // Read from the hash: BullMQ's getJob throws for a job whose data is not JSON.
  return (await fx.redis.hget(fx.queue.toKey(jobId), 'failedReason')) ?? undefined;
}

/** Calls of `command` so far, from INFO commandstats (the commands scripts run included). */
async function calls(command: string): Promise<number> {
  const info = await fx.redis.info('commandstats');
  return Number(new RegExp(`^cmdstat_${command}:calls=(\\d+)`, 'm').exec(info)?.[1] ?? 0);
}

/** Resolves once a take is blocked on BullMQ's marker (CLIENT LIST: blocked, BZPOPMIN). */
async function blockedOnMarker(): Promise<void> {
  await eventually(
    async () => / flags=b .*cmd=bzpopmin/.test(String(await fx.redis.client('LIST'))),
    'a take blocked on the marker',
  );
}

describe('ReleaseLoop: a take that left nothing waiting', () => {
  it('blocks on the marker next, with no empty take and no other script first', async () => {
    const rig = leadingLoop({ cap: 4 });
    try {
      await blockedOnMarker();
      const takes = await calls('rpoplpush');
      const scripts = await calls('evalsha');
      const id = await add();
      const call = await rig.nextCall();
      expect(call.jobId).toBe(id);
      await blockedOnMarker();
      // One take got the job and said nothing else waits: without that, BullMQ would have
      // tried an empty take, found the marker that take set, and tried another.
      expect(await calls('rpoplpush')).toBe(takes + 1);
      expect(await calls('evalsha')).toBe(scripts + 1);
      call.end('ok');
      await rig.ledger.idle();
    } finally {
      await rig.stop();
    }
  });
});

describe('ReleaseLoop: jobs of several engine requests (n > 1, a batch of prompts)', () => {
  it('counts a job as its engine requests, and holds one that does not fit until it does', async () => {
    const rig = leadingLoop({ cap: 4 });
    try {
      const three = await add({ sequences: 3 });
      const first = await rig.nextCall();
      expect(first.jobId).toBe(three);
      expect(rig.engine.inflight).toBe(3);
      // One slot left: a job of two waits (held), a job of one goes.
      const two = await add({ sequences: 2 });
      const one = await add();
      const next = await rig.nextCall();
      expect(next.jobId).toBe(one);
      expect(rig.engine.inflight).toBe(4);
      first.end('ok');
      // Three free: the held job of two goes, counted as two.
      const last = await rig.nextCall();
      expect(last.jobId).toBe(two);
      expect(rig.engine.inflight).toBe(3);
      next.end('ok');
      last.end('ok');
      await rig.ledger.idle();
      expect(rig.engine.inflight).toBe(0);
    } finally {
      await rig.stop();
    }
  });

  it("refuses a job wider than every engine's cap with a bad_request frame, and goes on", async () => {
    const frames: Frame[] = [];
    const subscriber = createRedis(fx.server.url, { name: 'gw1', role: 'subscriber' });
    await redisReady(subscriber);
    let framed = () => {};
    const gotFrame = new Promise<void>((resolve) => (framed = resolve));
    subscriber.on('messageBuffer', (_channel: Buffer, message: Buffer) => {
      frames.push(...messageFrames(message).map(decodeFrame));
      framed();
    });
    await subscriber.subscribe(fx.keys.replyChannel('gw1'));
    const rig = leadingLoop({ cap: 4 });
    try {
      const wide = await add({ sequences: 5 });
      const good = await add();
      const call = await rig.nextCall();
      expect(call.jobId).toBe(good);
      expect(rig.runner.discarded.map(({ id, reason }) => ({ id, reason }))).toEqual([
        { id: wide, reason: 'over_cap' },
      ]);
      await rig.runner.discarded[0]!.done;
      expect(await failedReason(wide)).toBe('over_cap');
      await gotFrame;
      expect(frames).toContainEqual(
        expect.objectContaining({
          type: 'error',
          jobId: wide,
          info: expect.objectContaining({
            code: 'bad_request',
            message: expect.stringMatching(/makes 5 engine requests; .* at most 4 at once/),
          }),
        }),
      );
      call.end('ok');
      await rig.ledger.idle();
    } finally {
      await rig.stop();
      await subscriber.quit();
    }
  });
});

describe('ReleaseLoop: frozen gauges', () => {
  it('reports the episode when it lets the probe go between two scrapes, once', async () => {
    // The last scrapes, all while a run of ours was on the engine, read the same full engine for
    // longer than the threshold; that run has ended since, and no scrape came after it.
    // Gauges that stay fresh however slow this machine is: the rule, not their age, is tested.
    const frozenPolicy: GatePolicy = { ...policy, maxGaugeAgeMs: 600_000, frozenAfterMs: 1000 };
    const rig = leadingLoop({ cap: 4, policy: frozenPolicy });
    const frozenMetric = async () =>
      (await rig.metrics.engineGaugesFrozen.get()).values.find((v) => v.labels['engine'] === 'e')
        ?.value;
    try {
      const at = Date.now();
      rig.engine.health = 'healthy';
      rig.engine.gauges = {
        running: 4,
        waiting: 0,
        kvUsage: 0.2,
        steps: 7,
        at,
        unchangedSince: at - 2000,
        inflightAtScrape: 0,
      };
      const probe = await add();
      const call = await rig.nextCall();
      expect(call.jobId).toBe(probe);
      expect(rig.warnings).toEqual([expect.stringMatching(/^engine gauges frozen/)]);
      expect(await frozenMetric()).toBe(1);
      expect(rig.engine.frozenSince).toBe(at - 2000);
      // A second probe after the first, with no scrape between: the same episode, not said again.
      const next = await add();
      call.end('ok');
      const second = await rig.nextCall();
      expect(second.jobId).toBe(next);
      expect(rig.warnings).toHaveLength(1);
      second.end('ok');
    } finally {
      await rig.stop();
    }
  });
});

describe('ReleaseLoop', () => {
  it('fails a job whose replica no key may name when its own take gets it, and goes on', async () => {
    const rig = leadingLoop();
    try {
      const bad = await add({ replica: 'gw 1' });
      const good = await add();
      // Taken after the bad one (first come, first served), so placed after it.
      const call = await rig.nextCall();
      expect(call.jobId).toBe(good);
      expect(rig.runner.discarded.map(({ id, reason }) => ({ id, reason }))).toEqual([
        { id: bad, reason: 'invalid_payload' },
      ]);
      expect(rig.errors).toEqual([
        {
          o: { jobId: bad, err: expect.stringMatching(/field replica must be .*"gw 1"/) },
          m: 'invalid job payload',
        },
      ]);
      await rig.runner.discarded[0]!.done;
      expect(await failedReason(bad)).toBe('invalid_payload');
      call.end('ok');
      await rig.ledger.idle();
      expect(rig.engine.inflight).toBe(0);
    } finally {
      await rig.stop();
    }
  });

  it('fails such a job when a slot is handed over to it past its deadline, and frees the slot', async () => {
    const rig = leadingLoop();
    try {
      const running = await add();
      const call = await rig.nextCall();
      expect(call.jobId).toBe(running);
      // The engine is full: the loop leaves this one to the end of the run.
      const bad = await add({ replica: 'gw 1', deadline: Date.now() - 1000 });
      const freed = rig.ledger.idle();
      call.end('ok');
      // The slot is freed in the turn the job handed over is placed.
      await freed;
      expect(await rig.handovers()).toBe(1);
      expect(rig.runner.discarded.map(({ id, reason }) => ({ id, reason }))).toEqual([
        { id: bad, reason: 'invalid_payload' },
      ]);
      expect(rig.errors.map((e) => e.m)).toEqual(['invalid job payload']);
      await rig.runner.discarded[0]!.done;
      expect(await failedReason(bad)).toBe('invalid_payload');
      expect(await fx.queue.getJobState(running)).toBe('completed');
      expect(rig.engine.inflight).toBe(0);
    } finally {
      await rig.stop();
    }
  });

  it('fails a job whose data is not JSON when its own take gets it, and goes on', async () => {
    const rig = leadingLoop();
    try {
      const bad = await addUnparseable();
      const good = await add();
      const call = await rig.nextCall();
      expect(call.jobId).toBe(good);
      expect(rig.runner.discarded.map(({ id, reason }) => ({ id, reason }))).toEqual([
        { id: bad, reason: 'invalid_payload' },
      ]);
      expect(rig.errors).toEqual([
        {
          o: { jobId: bad, err: expect.stringMatching(/\(root\) must be an object, got "\{/) },
          m: 'invalid job payload',
        },
      ]);
      await rig.runner.discarded[0]!.done;
      expect(await failedReason(bad)).toBe('invalid_payload');
      call.end('ok');
      await rig.ledger.idle();
    } finally {
      await rig.stop();
    }
  });

  it('fails a job whose data is not JSON when a slot is handed over to it, and frees the slot', async () => {
    const rig = leadingLoop();
    try {
      const running = await add();
      const call = await rig.nextCall();
      expect(call.jobId).toBe(running);
      // The engine is full: the loop leaves this one to the end of the run.
      const bad = await addUnparseable();
      const freed = rig.ledger.idle();
      call.end('ok');
      await freed;
      expect(await rig.handovers()).toBe(1);
      expect(rig.runner.discarded.map(({ id, reason }) => ({ id, reason }))).toEqual([
        { id: bad, reason: 'invalid_payload' },
      ]);
      expect(rig.errors.map((e) => e.m)).toEqual(['invalid job payload']);
      await rig.runner.discarded[0]!.done;
      expect(await failedReason(bad)).toBe('invalid_payload');
      // The loop still releases.
      const next = await add();
      const nextCall = await rig.nextCall();
      expect(nextCall.jobId).toBe(next);
      nextCall.end('ok');
    } finally {
      await rig.stop();
    }
  });

  it('catches a throw while placing a job handed over: the job is failed, the slot freed, the loop goes on', async () => {
    const handedOver = `job-${jobs + 2}`;
    const rig = leadingLoop({ throwOnTaken: handedOver });
    try {
      const running = await add();
      const call = await rig.nextCall();
      expect(call.jobId).toBe(running);
      expect(await add()).toBe(handedOver);
      const freed = rig.ledger.idle();
      call.end('ok');
      await freed;
      expect(await rig.handovers()).toBe(1);
      expect(rig.errors).toEqual([
        { o: { jobId: handedOver, err: expect.any(Error) }, m: 'placing a job failed' },
      ]);
      expect(rig.runner.discarded.map(({ id, reason }) => ({ id, reason }))).toEqual([
        { id: handedOver, reason: 'internal_error' },
      ]);
      await rig.runner.discarded[0]!.done;
      expect(await failedReason(handedOver)).toBe('internal_error');
      expect(rig.engine.inflight).toBe(0);
      expect(rig.ledger.size).toBe(0);
      // The loop still releases.
      const next = await add();
      const nextCall = await rig.nextCall();
      expect(nextCall.jobId).toBe(next);
      nextCall.end('ok');
    } finally {
      await rig.stop();
    }
  });

  it('tells the client of a job its dead dispatcher left (a deferred failure) dispatcher_lost, then fails it unrun', async () => {
    const frames: Frame[] = [];
    const subscriber = createRedis(fx.server.url, { name: 'gw1', role: 'subscriber' });
    await redisReady(subscriber);
    // A marker published on the relay's own connection after its frames arrives after them.
    let marked = () => {};
    subscriber.on('messageBuffer', (channel: Buffer, message: Buffer) => {
      if (channel.toString() === 'marker') marked();
      else frames.push(...messageFrames(message).map(decodeFrame));
    });
    await subscriber.subscribe(fx.keys.replyChannel('gw1'), 'marker');
    const framesSoFar = async () => {
      const mark = new Promise<void>((resolve) => (marked = resolve));
      await fx.redis.publish('marker', '');
      await mark;
      return frames;
    };
    // The dead leader: it took the job, and its lock is gone. Its stalled check (as the next
    // leader's would) marks the active job, then moves it back with a deferred failure.
    const dead = new PoolWorker(fx.keys.queueName('p'), null, {
      connection: fx.bull,
      prefix: fx.keys.prefix,
      autorun: false,
      maxStalledCount: 0,
    });
    // BullMQ's own check, run by hand: private in its types.
    const stalledCheck = () =>
      (dead as unknown as { moveStalledJobsToWait(): Promise<void> }).moveStalledJobsToWait();
    let rig: ReturnType<typeof leadingLoop> | undefined;
    try {
      const lost = await add();
      expect((await dead.getNextJob('dead:1', { block: false }))?.id).toBe(lost);
      await fx.redis.del(`${fx.queue.toKey(lost)}:lock`);
      await stalledCheck();
      await fx.redis.del(fx.queue.toKey('stalled-check'));
      await stalledCheck();
      expect(await fx.queue.getJobState(lost)).toBe('waiting');

      rig = leadingLoop();
      await rig.runner.discards(1);
      expect(rig.runner.discarded.map(({ id, reason }) => ({ id, reason }))).toEqual([
        { id: lost, reason: 'stalled' },
      ]);
      await rig.runner.discarded[0]!.done;
      expect(await failedReason(lost)).toBe('stalled');
      expect(await framesSoFar()).toEqual([
        {
          type: 'error',
          jobId: lost,
          seq: 0,
          info: { code: 'dispatcher_lost', message: expect.stringMatching(/dispatcher .* died/) },
        },
      ]);
      // Never run: the next job is the engine's first call.
      const next = await add();
      const call = await rig.nextCall();
      expect(call.jobId).toBe(next);
      call.end('ok');
      await rig.ledger.idle();
    } finally {
      await rig?.stop();
      await dead.close();
      await subscriber.quit();
    }
  });

  it("catches a throw in the rest of a run's end too: logged, the slot freed", async () => {
    const rig = leadingLoop({ throwOnHandover: true });
    try {
      const running = await add();
      const call = await rig.nextCall();
      expect(call.jobId).toBe(running);
      // Handed over, then left active: the throw came before it was placed. Its lock is not
      // renewed, so a stalled check fails it (not run here).
      await add();
      call.end('ok');
      await rig.logged;
      expect(rig.errors).toEqual([
        { o: { jobId: running, err: expect.any(Error) }, m: 'ending a run failed' },
      ]);
      expect(rig.ledger.size).toBe(0);
      expect(rig.engine.inflight).toBe(0);
      expect(await fx.queue.getJobState(running)).toBe('completed');
    } finally {
      await rig.stop();
    }
  });
});
