// The loss watch (redis-loss.ts): a closed reply connection and a Redis that stops answering
// the probe with its sockets open are one loss, after the same grace. First its timing, on
// fake timers against a fake subscriber and fake probe answers; then the probe and the watch
// on real connections to a redis-server that is stopped (SIGSTOP) and continued.
import { EventEmitter } from 'node:events';
import { createRedis, redisReady, type Redis } from '@sluice/redis';
import { eventually, startRedis, type TestRedis } from '@sluice/test/support';
import { afterAll, afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { ReplyLossWatch, type LossCause } from '../src/redis-loss.ts';
import { RedisProbe, type RedisAnswers } from '../src/redis-probe.ts';

const GRACE_MS = 4000;
/** The watch's clock: fake time, plus what a stalled event loop lost (timers run late by it). */
let stalledMs = 0;
const clock = () => Date.now() + stalledMs;

class FakeSubscriber extends EventEmitter {
  status = 'ready';

  close(): void {
    this.status = 'reconnecting';
    this.emit('close');
  }

  ready(): void {
    this.status = 'ready';
    this.emit('ready');
  }
}

class FakeAnswers implements RedisAnswers {
  answeredAt: number | undefined;
  private readonly listeners = new Set<() => void>();

  onAnswer(listener: () => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  answer(): void {
    this.answeredAt = clock();
    for (const listener of this.listeners) listener();
  }
}

describe('ReplyLossWatch timing', () => {
  let subscriber: FakeSubscriber;
  let answers: FakeAnswers;
  let lost: LossCause[];
  let back: boolean[];
  let watch: ReplyLossWatch;

  beforeEach(() => {
    vi.useFakeTimers();
    stalledMs = 0;
    subscriber = new FakeSubscriber();
    answers = new FakeAnswers();
    lost = [];
    back = [];
    watch = new ReplyLossWatch(subscriber as unknown as Redis, {
      graceMs: GRACE_MS,
      answers,
      now: clock,
      onLost: (cause) => lost.push(cause),
      onBack: (afterLoss) => back.push(afterLoss),
    });
  });

  afterEach(() => {
    watch.stop();
    vi.useRealTimers();
  });

  /** Answers every 500 ms for `ms`, as the probe does while Redis answers. */
  function answering(ms: number): void {
    for (let t = 0; t < ms; t += 500) {
      answers.answer();
      vi.advanceTimersByTime(500);
    }
  }

  it('loses a silent Redis the grace after its last answer, with its socket open', () => {
    answering(10_000);
    answers.answer();
    vi.advanceTimersByTime(GRACE_MS - 1);
    expect(lost).toEqual([]);
    vi.advanceTimersByTime(1);
    expect(lost).toEqual(['silent']);
    vi.advanceTimersByTime(60_000);
    expect(lost).toEqual(['silent']);
    expect(back).toEqual([]);

    answers.answer();
    expect(back).toEqual([true]);
    // Watched again from there.
    vi.advanceTimersByTime(GRACE_MS);
    expect(lost).toEqual(['silent', 'silent']);
  });

  it('fails nobody for a slow answer within the grace', () => {
    answers.answer();
    // One PING past its timeout, the next answered late: 3.9 s without an answer.
    vi.advanceTimersByTime(GRACE_MS - 100);
    answers.answer();
    answering(10_000);
    expect(lost).toEqual([]);
    expect(back).toEqual([]);
  });

  it("fails nobody when the gateway's own event loop stalled past the grace", () => {
    answering(2000);
    // The loop is blocked for 6 s: no PING is sent or read, and the silence timer fires 6 s late.
    stalledMs = 6000;
    vi.advanceTimersByTime(GRACE_MS - 2000);
    expect(lost).toEqual([]);
    // Once the loop runs again, the probe asks and hears back within the re-check.
    answers.answer();
    vi.advanceTimersByTime(2000);
    expect(lost).toEqual([]);
    // A Redis that stays silent after the stall is still lost.
    vi.advanceTimersByTime(GRACE_MS);
    expect(lost).toEqual(['silent']);
  });

  it('watches nothing before the first answer', () => {
    vi.advanceTimersByTime(60_000);
    expect(lost).toEqual([]);
  });

  it('still loses a closed reply connection the grace after it closed', () => {
    answers.answer();
    subscriber.close();
    // The command connection is fine: the probe answers on.
    answering(GRACE_MS - 500);
    expect(lost).toEqual([]);
    answering(500);
    expect(lost).toEqual(['closed']);
    subscriber.ready();
    expect(back).toEqual([true]);
  });

  it('is lost once when both show it, and back once both are', () => {
    answers.answer();
    subscriber.close();
    vi.advanceTimersByTime(60_000);
    expect(lost).toEqual(['closed']);
    // Reconnected, but Redis has not answered the probe yet.
    subscriber.ready();
    expect(back).toEqual([]);
    answers.answer();
    expect(back).toEqual([true]);
  });

  it('is back from silence only once the reply connection is ready too', () => {
    answers.answer();
    vi.advanceTimersByTime(GRACE_MS);
    expect(lost).toEqual(['silent']);
    subscriber.close();
    answers.answer();
    expect(back).toEqual([]);
    subscriber.ready();
    expect(back).toEqual([true]);
  });

  it('rides out a reconnect within the grace', () => {
    answers.answer();
    subscriber.close();
    answering(1000);
    subscriber.ready();
    answering(10_000);
    expect(lost).toEqual([]);
    expect(back).toEqual([false]);
  });

  it('watches nothing once stopped', () => {
    answers.answer();
    watch.stop();
    vi.advanceTimersByTime(60_000);
    expect(lost).toEqual([]);
  });
});

describe('RedisProbe and ReplyLossWatch on a stopped redis-server', () => {
  let server: TestRedis;
  let redis: Redis;
  let subscriber: Redis;

  afterAll(async () => {
    server?.process.child.kill('SIGCONT');
    redis?.disconnect();
    subscriber?.disconnect();
    await server?.stop();
  });

  it('loses Redis when it stops answering, and is back when it goes on', async () => {
    server = await startRedis();
    redis = createRedis(server.url, { name: 'probe-test:command', role: 'command' });
    subscriber = createRedis(server.url, { name: 'probe-test:replies', role: 'subscriber' });
    await Promise.all([redisReady(redis), redisReady(subscriber)]);
    await subscriber.subscribe('replies');

    const probe = new RedisProbe(redis);
    let onLost!: (cause: LossCause) => void;
    let onBack!: (afterLoss: boolean) => void;
    const lost = new Promise<LossCause>((resolve) => (onLost = resolve));
    const back = new Promise<boolean>((resolve) => (onBack = resolve));
    const watch = new ReplyLossWatch(subscriber, {
      // Above the command timeout: one PING past it is not a loss.
      graceMs: 1500,
      answers: probe,
      onLost: (cause) => onLost(cause),
      onBack: (afterLoss) => onBack(afterLoss),
    });
    try {
      probe.start();
      await eventually(() => probe.up, 'the probe to hear Redis');

      server.process.child.kill('SIGSTOP');
      expect(await lost).toBe('silent');
      // Nothing closed: only the probe could tell.
      expect(subscriber.status).toBe('ready');

      server.process.child.kill('SIGCONT');
      expect(await back).toBe(true);
      expect(probe.up).toBe(true);
    } finally {
      watch.stop();
      probe.stop();
    }
  });
});
