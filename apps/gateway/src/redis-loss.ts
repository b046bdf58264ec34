// The reply connection lost. Frames reach this replica only over its subscriber connection;
// while that is down no held request can progress, and a Redis that comes back empty has
// lost the jobs too. A short outage (a failover, a restart with persistence) is ridden out:
// ioredis reconnects and resubscribes, and a stream that missed frames meanwhile sees the
// gap (`frame_lost`). Past the grace period every held client is answered, and the jobs
// they leave behind are taken back once Redis answers again.
//
// A Redis that stops answering with its sockets open (SIGSTOP, a network partition) closes
// nothing: the subscriber stays `ready` and no frame comes. The gateway's PING probe
// (redis-probe.ts) shows it, and a Redis that has not answered the probe for the grace
// period, counted from its last answer, is lost the same way. Counting from the last answer
// rather than from the first PING past its timeout keeps every held client's answer within
// the grace of the fault (before the reply router's silence timeout would call it a lost
// dispatcher), and a single slow PING, answered or timed out, fails nobody: the next one
// answers well within the grace. The loss ends when the subscriber is ready and Redis
// answers the probe again.
//
// A subscriber that stays `ready` and delivers nothing while Redis answers (a hung cluster
// node under it, a half-open connection) is found by the reply-channel heartbeat
// (reply-heartbeat.ts), and it is lost the same way too: deaf past the grace, counted from the
// last heartbeat heard, as silence is counted from the last answer. Frames published to a
// deaf subscriber are gone, so a held request cannot count on being completed; the heartbeat
// recycles the subscriber first, well within the grace (deafAfterMs), and a request that did
// lose a frame to a shorter deafness sees the gap as after a short outage. The loss ends when a heartbeat comes
// back: a reconnect alone does not show that the new connection hears.
import { performance } from 'node:perf_hooks';
import type { Redis } from '@sluice/redis';
import type { RedisAnswers } from './redis-probe.js';
import type { ReplyHearing } from './reply-heartbeat.js';

/**
 * `closed`: the subscriber connection was down; `silent`: Redis did not answer the probe;
 * `deaf`: Redis answered, and the subscriber delivered none of the heartbeats.
 */
export type LossCause = 'closed' | 'silent' | 'deaf';

export interface ReplyLossOptions {
  graceMs: number;
  /** The probe's answers; without them only a closed connection counts. */
  answers?: RedisAnswers;
  /** The reply-channel heartbeat; without it a deaf subscriber is not seen. */
  hearing?: ReplyHearing;
  /** The clock of `answers.answeredAt` and `hearing.heardAt` (default `performance.now`). */
  now?: () => number;
  /** Redis has been lost for the grace period. */
  onLost(cause: LossCause): void;
  /** It is ready again (after a loss, or within the grace). */
  onBack(afterLoss: boolean): void;
}

/**
 * A silence timer this late fired after a stall of the gateway's own event loop (a long GC, a
 * starved process): the probe could not ask, nor read an answer waiting in the socket, so the
 * silence is the gateway's, not Redis's. It is judged again once the probe has had time to
 * ask and hear back (one PING interval and the command timeout).
 */
const LATE_MS = 1000;
const RECHECK_MS = 1500;

export class ReplyLossWatch {
  private timer: NodeJS.Timeout | undefined;
  private silenceTimer: NodeJS.Timeout | undefined;
  private deafTimer: NodeJS.Timeout | undefined;
  private lost = false;
  private readonly onDown = () => this.down();
  private readonly onReady = () => this.up();
  private readonly offAnswer: () => void;
  private readonly offHearing: () => void;
  private readonly now: () => number;

  constructor(
    private readonly subscriber: Redis,
    private readonly options: ReplyLossOptions,
  ) {
    this.now = options.now ?? (() => performance.now());
    for (const event of ['close', 'end', 'error'] as const) subscriber.on(event, this.onDown);
    subscriber.on('ready', this.onReady);
    this.offAnswer = options.answers?.onAnswer(() => this.answered()) ?? (() => {});
    this.offHearing =
      options.hearing?.onChange((deaf) => (deaf ? this.watchDeafness() : this.heard())) ??
      (() => {});
    if (options.answers?.answeredAt !== undefined) this.watchSilence(options.graceMs);
  }

  /** Frames can arrive: the subscriber connection is ready. */
  get connected(): boolean {
    return this.subscriber.status === 'ready';
  }

  /** Frames do arrive: the subscriber is ready and not deaf. */
  get listening(): boolean {
    return this.connected && !this.deaf;
  }

  stop(): void {
    clearTimeout(this.timer);
    clearTimeout(this.silenceTimer);
    this.silenceTimer = undefined;
    clearTimeout(this.deafTimer);
    this.deafTimer = undefined;
    this.offAnswer();
    this.offHearing();
    for (const event of ['close', 'end', 'error'] as const) this.subscriber.off(event, this.onDown);
    this.subscriber.off('ready', this.onReady);
  }

  /** How long until Redis has been silent for the grace period; undefined before any answer. */
  private silenceLeftMs(): number | undefined {
    const at = this.options.answers?.answeredAt;
    return at === undefined ? undefined : at + this.options.graceMs - this.now();
  }

  /** Redis has not answered the probe for the grace period. */
  private get silent(): boolean {
    const left = this.silenceLeftMs();
    return left !== undefined && left <= 0;
  }

  /** The heartbeat says the subscriber delivers nothing. */
  private get deaf(): boolean {
    return this.options.hearing?.deaf ?? false;
  }

  private down(): void {
    if (this.connected || this.timer || this.lost) return;
    this.timer = setTimeout(() => {
      this.timer = undefined;
      if (this.connected) return;
      this.lose('closed');
    }, this.options.graceMs);
  }

  private up(): void {
    clearTimeout(this.timer);
    this.timer = undefined;
    // Lost to silence: back once Redis answers the probe too, not at a reconnect alone; lost
    // to deafness: once a heartbeat comes back.
    if (this.lost && (this.silent || this.deaf)) return;
    this.back();
  }

  private answered(): void {
    if (!this.silenceTimer) this.watchSilence(this.options.graceMs);
    if (this.lost && this.connected && !this.deaf) this.back();
  }

  private heard(): void {
    clearTimeout(this.deafTimer);
    this.deafTimer = undefined;
    if (this.lost && this.connected && !this.silent) this.back();
  }

  /**
   * Deaf: lost at the grace after the last heartbeat heard, unless one comes back first. A
   * timer this late is judged again as the silence timer is (the heartbeat may be waiting in
   * the socket).
   */
  private watchDeafness(ms?: number): void {
    if (this.lost || this.deafTimer) return;
    const heardAt = this.options.hearing!.heardAt;
    const wait = ms ?? Math.max(0, Math.ceil(heardAt + this.options.graceMs - this.now()));
    const dueAt = this.now() + wait;
    this.deafTimer = setTimeout(() => {
      this.deafTimer = undefined;
      if (this.lost || !this.deaf) return;
      if (this.now() - dueAt > LATE_MS) return this.watchDeafness(RECHECK_MS);
      const left = this.options.hearing!.heardAt + this.options.graceMs - this.now();
      if (left > 0) return this.watchDeafness(Math.ceil(left));
      // Deaf even while the recycled connection is still reconnecting: that is the cure's.
      this.lose(this.silent ? 'silent' : 'deaf');
    }, wait);
    this.deafTimer.unref();
  }

  /**
   * One timer, armed for the grace and re-armed for what is left of it when it fires after
   * answers came meanwhile; an answer does not touch it (two a second).
   */
  private watchSilence(ms: number): void {
    const dueAt = this.now() + ms;
    this.silenceTimer = setTimeout(() => {
      this.silenceTimer = undefined;
      if (this.lost) return;
      if (this.now() - dueAt > LATE_MS) return this.watchSilence(RECHECK_MS);
      const left = this.silenceLeftMs();
      if (left === undefined) return;
      if (left > 0) return this.watchSilence(Math.ceil(left));
      this.lose(this.connected ? 'silent' : 'closed');
    }, ms);
    this.silenceTimer.unref();
  }

  private lose(cause: LossCause): void {
    if (this.lost) return;
    this.lost = true;
    this.options.onLost(cause);
  }

  private back(): void {
    const afterLoss = this.lost;
    this.lost = false;
    this.options.onBack(afterLoss);
  }
}
