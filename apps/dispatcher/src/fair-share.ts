// The fair share of one pool among its tenants, as the leader runs it: before each take, the
// tenant with waiting work and the least weighted service (`@sluice/admission`'s Virtual
// Token Counter) has its next job moved to the front of the queue; input tokens are charged
// at release (the gateway's estimate, replaced by the engine's `usage.prompt_tokens` when the
// answer reports it), output tokens as they stream. A non-streamed answer shows nothing until
// it is whole, and a run that ends before (cancelled, timed out, failed) reports no usage, so
// its output is reserved at release instead and settled when the run ends (`outputEnded`):
// otherwise a tenant would pay only its prompts for the answers it abandons. The charges are
// made when the release loop lets a job go (`released`, in turn with the picks, so the next
// pick sees them) and given back when the job runner then skips the job (`notRun`); the
// tenant's counters count it only once it really goes to its engine (`started`). The counters
// live in this process and are written to Redis (keys.fairShare) every second and at a
// handover, with who was waiting, so the next leader goes on from them (docs/broker.md,
// "Tenants and fair share").
//
// Each pick sends the move and the reading for the next pick ahead of the take, on BullMQ's
// connection (tenant-queues.ts): once the take answered, the next pick needs no read of its
// own unless the take got another job than the reading's next (`taken`).
import { VirtualTokenCounter, type FairShareState } from '@sluice/admission';
import type { TenantConfig } from '@sluice/config';
import type { DispatcherMetrics } from '@sluice/observability';
import type { JobPayload, KeySpace } from '@sluice/protocol';
import type { Redis } from '@sluice/redis';
import type { Queue } from 'bullmq';
import { hsetWhileHeld, type LeaseHolder } from './lease.js';
import { sequencesOf } from './ledger.js';
import {
  afterTake,
  TenantQueues,
  type MoveAndReading,
  type TenantQueue,
  type TenantQueuesReading,
} from './tenant-queues.js';
import { limitedWarn, type LimitedWarn } from './warn-limit.js';
import { IdTable } from './id-table.js';

// Beside the counters in the same hash: who was waiting at the last pick, and who was picked,
// so the next leader lifts nobody who was waiting all along. Tenant names cannot contain ':'.
const ACTIVE_FIELD = ':active';
const LAST_FIELD = ':last';

/**
 * The output per sequence reserved for a non-streamed request that sets no limit
 * (`max_tokens`, `max_completion_tokens`) before any such run of the pool reported its usage.
 * vLLM's own default limit is the rest of the context window (tens of thousands of tokens), far
 * above a usual answer; 256 is a short answer's length, so an honest client is not held back
 * for long while it runs, and the pool's mean (below) soon replaces it.
 */
export const DEFAULT_OUTPUT_PER_SEQUENCE = 256;
/**
 * How much one run moves that mean: an exponentially weighted mean over about the last 32
 * non-streamed runs without a limit, so it follows the pool's answers as they change and no
 * single run, however long, moves it far.
 */
const OUTPUT_MEAN_WEIGHT = 1 / 32;

export interface FairShareDeps {
  pool: string;
  tenants: readonly TenantConfig[];
  keys: KeySpace;
  /** Command connection. */
  redis: Redis;
  /** BullMQ's connection, shared by the pool's Queue and Worker: the takes run on it. */
  bull: Redis;
  queue: Queue;
  /** The pool's lease: the counters are written only while it is this dispatcher's. */
  lease: LeaseHolder;
  metrics: DispatcherMetrics;
  log: { warn(o: object, m: string): void };
}

/** A tenant as `sluice status` shows it. */
export interface TenantView {
  queued: number;
  inflight: number;
  weight: number;
  /** Weighted service so far (the fair-share counter). */
  virtualTokens: number;
}

export class FairShare {
  private readonly queues: TenantQueues;
  private readonly weights: ReadonlyMap<string, number>;
  private counter: VirtualTokenCounter;
  private readonly inflight = new Map<string, number>();
  private queued = new Map<string, number>();
  private dirty = false;
  private readonly warn: LimitedWarn;
  /** The reading sent with the last pick, ahead of its take, until the next pick uses it. */
  private ahead: Promise<MoveAndReading> | undefined;
  /** The queues as the last take left them, when its reading could tell. */
  private afterLastTake: Promise<TenantQueuesReading | undefined> | undefined;
  /** The output reserved for each non-streamed job released and not yet settled, by job id. */
  // An IdTable, not a Map: entries come and go with every non-streamed job (id-table.ts).
  private reserved = new IdTable<{ tenant: string; tokens: number }>();
  /**
   * Output per sequence of the pool's non-streamed runs without a limit that reported usage
   * (a running mean), reserved for the next such job. Kept in this process only: a new leader
   * starts again from DEFAULT_OUTPUT_PER_SEQUENCE.
   */
  private outputPerSequence = DEFAULT_OUTPUT_PER_SEQUENCE;

  constructor(private readonly deps: FairShareDeps) {
    const names = deps.tenants.map((t) => t.name);
    this.weights = new Map(deps.tenants.map((t) => [t.name, t.weight]));
    this.counter = new VirtualTokenCounter({ weights: this.weights });
    this.queues = new TenantQueues(deps.pool, names, deps.keys, deps.redis, deps.bull, deps.queue);
    this.warn = limitedWarn(deps.log);
  }

  /** Takes over the counters the previous leader wrote; keeps its own when Redis cannot say. */
  async load(): Promise<void> {
    const { redis, keys, pool, log } = this.deps;
    // A reading from before this lease (another leader may have run meanwhile) is not used.
    this.ahead = undefined;
    this.afterLastTake = undefined;
    try {
      const stored = await redis.hgetall(keys.fairShare(pool));
      const counters: Record<string, number> = {};
      for (const [tenant, value] of Object.entries(stored)) {
        const n = Number(value);
        // Only configured tenants, and only numbers: a stale or foreign field is ignored.
        if (this.weights.has(tenant) && Number.isFinite(n) && n >= 0) counters[tenant] = n;
      }
      this.counter = new VirtualTokenCounter(
        { weights: this.weights },
        counters,
        this.readState(stored),
      );
      this.setCounterMetrics();
    } catch (err) {
      log.warn({ pool, err: (err as Error).message }, 'reading fair-share counters failed');
    }
  }

  /** Writes the counters when they changed since the last write; never rejects. */
  async flush(): Promise<void> {
    if (!this.dirty) return;
    this.dirty = false;
    const { redis, keys, pool } = this.deps;
    const snapshot = this.counter.snapshot();
    if (Object.keys(snapshot).length === 0) return;
    const { active, lastServed } = this.counter.state();
    const fields = {
      ...snapshot,
      [ACTIVE_FIELD]: active.join(','),
      [LAST_FIELD]: lastServed ?? '',
    };
    // Not written when the lease went to another dispatcher meanwhile: the next leader read
    // the counters when it took over and goes on from them, and these would overwrite its own.
    await hsetWhileHeld(redis, this.deps.lease, keys.fairShare(pool), fields).catch(() => {
      this.dirty = true;
    });
    this.setCounterMetrics();
  }

  /**
   * Puts the next job of the tenant the fair share picks at the front of the queue, when
   * that is not the job BullMQ would take anyway, and sends the reading for the next pick
   * behind the move. The take must be called right after this resolves, and `taken` once it
   * answered. Failures leave the queue's own order.
   */
  async prepareNext(): Promise<void> {
    const { metrics, pool } = this.deps;
    let reading: TenantQueuesReading;
    try {
      reading = await this.lastReading();
    } catch (err) {
      // The take goes on in the queue's own order: one release not in fair order.
      metrics.fairSharePicks.inc({ pool, outcome: 'read_failed' });
      this.warn('reading the tenant queues failed', err, { pool });
      return;
    }
    this.setQueued(reading.tenants);
    const waiting = reading.tenants.filter((t) => t.head !== undefined);
    const chosen = this.counter.pick(waiting.map((t) => t.tenant));
    const head = waiting.find((t) => t.tenant === chosen)?.head;
    const move = head !== undefined && head !== reading.next ? head : undefined;
    // Sent now, before the caller's take: nothing may be awaited between this and the take.
    const ahead = this.queues.moveAndRead(move);
    this.ahead = ahead;
    // A failed reading costs the next pick only a read of its own (`taken`).
    ahead.catch(() => {});
    if (move === undefined) {
      metrics.fairSharePicks.inc({ pool, outcome: head === undefined ? 'none' : 'in_order' });
      return;
    }
    // Gone meanwhile (its client left): the take gets the queue's own next job.
    void ahead.then(
      ({ moved }) => metrics.fairSharePicks.inc({ pool, outcome: moved ? 'moved' : 'move_failed' }),
      () => metrics.fairSharePicks.inc({ pool, outcome: 'move_failed' }),
    );
  }

  /**
   * The take after `prepareNext` answered: `jobId` is the job it got (undefined: none, or it
   * failed); `waited` when it waited for BullMQ's marker, so the reading sent ahead of it is
   * older than what it took. The next pick uses that reading when the take got its next job.
   */
  taken(jobId: string | undefined, waited: boolean): void {
    const ahead = this.ahead;
    this.ahead = undefined;
    this.afterLastTake =
      ahead && jobId !== undefined && !waited
        ? ahead.then(
            ({ reading }) => afterTake(reading, jobId),
            () => undefined,
          )
        : undefined;
  }

  /** This take is a promoted held job's, at the queue's front (holding.ts): no pick. */
  promotedFirst(): void {
    this.ahead = undefined;
    this.afterLastTake = undefined;
    this.deps.metrics.fairSharePicks.inc({ pool: this.deps.pool, outcome: 'promoted' });
  }

  /**
   * The release loop let a job of `payload.tenant` go: it left the queue, and its input is
   * charged now, in turn with the picks, so the next pick sees it (the runner's checks before
   * the engine call take a Redis round trip, too late for that pick). A non-streamed job's
   * output is reserved with it (`expectedOutput`). `started` or `notRun` follows.
   */
  released(jobId: string, payload: JobPayload): void {
    const tenant = payload.tenant;
    if (tenant === undefined || !this.weights.has(tenant)) return;
    this.queues.remove(tenant, jobId);
    this.counter.chargeInput(tenant, payload.promptTokens ?? 0);
    if (!payload.stream) {
      // vLLM writes a non-streamed answer only once it is generated (serving_chat.py,
      // `chat_completion_full_generator`): nothing is charged while it runs, and a run that
      // ends early reports no usage. Charged ahead, it counts in the picks while it runs.
      const reserve = this.expectedOutput(payload);
      this.counter.chargeOutput(tenant, reserve);
      this.reserved.set(jobId, { tenant, tokens: reserve });
    }
    this.dirty = true;
    this.inflight.set(tenant, (this.inflight.get(tenant) ?? 0) + 1);
    this.deps.metrics.tenantInflight.set(
      { pool: this.deps.pool, tenant },
      this.inflight.get(tenant)!,
    );
  }

  /** A job `released` really goes to its engine: the tenant's counters count it. */
  started(payload: JobPayload): void {
    const tenant = payload.tenant;
    if (tenant === undefined || !this.weights.has(tenant)) return;
    const pool = this.deps.pool;
    this.deps.metrics.tenantReleased.inc({ pool, tenant });
    this.deps.metrics.tenantTokens.inc({ pool, tenant, kind: 'input' }, payload.promptTokens ?? 0);
  }

  /**
   * A job `released` was not run after all (its client left, it was cancelled, its body was
   * gone): its input charge, and the output reserved for it, are given back, so a tenant whose
   * jobs never reached an engine does not fall behind in the order.
   */
  notRun(jobId: string, payload: JobPayload): void {
    const reserved = this.takeReserved(jobId);
    const tenant = payload.tenant;
    if (tenant === undefined || !this.weights.has(tenant)) return;
    this.counter.refundInput(tenant, payload.promptTokens ?? 0);
    this.counter.correctOutput(tenant, reserved, 0);
    this.dirty = true;
  }

  /**
   * The engine reported the prompt's tokens (`usage.prompt_tokens`) at the end of a run: the
   * input charged at release, the gateway's estimate, is replaced by that count.
   */
  inputReported(payload: JobPayload, promptTokens: number): void {
    const tenant = payload.tenant;
    if (tenant === undefined || !this.weights.has(tenant)) return;
    this.counter.correctInput(tenant, payload.promptTokens ?? 0, promptTokens);
    this.dirty = true;
  }

  /**
   * The engine call of a non-streamed job `released` ended: the output reserved for it is
   * settled. Replaced by `completionTokens`, the engine's `usage.completion_tokens`, when the
   * answer reported it; given back when the engine generated nothing for certain (`refused`:
   * a 4xx answer, or an engine never reached); kept otherwise. A run cancelled by its client, timed out or
   * failed reports no usage, and what the engine generated for it is unknown: the tenant pays
   * the reservation, as a stream it abandons pays the tokens that passed. A streamed job has
   * nothing reserved (its count is settled through `output`).
   */
  outputEnded(
    jobId: string,
    payload: JobPayload,
    completionTokens: number | undefined,
    refused: boolean,
  ): void {
    const reserved = this.takeReserved(jobId);
    const tenant = payload.tenant;
    if (payload.stream || tenant === undefined || !this.weights.has(tenant)) return;
    if (completionTokens === undefined) {
      if (refused) {
        this.counter.correctOutput(tenant, reserved, 0);
        this.dirty = true;
      }
      return;
    }
    this.counter.correctOutput(tenant, reserved, completionTokens);
    this.dirty = true;
    if (completionTokens > 0)
      this.deps.metrics.tenantTokens.inc(
        { pool: this.deps.pool, tenant, kind: 'output' },
        completionTokens,
      );
    // Only answers no limit cut short tell what a request without a limit will cost.
    if (payload.maxTokens === undefined) {
      const perSequence = completionTokens / sequencesOf(payload);
      this.outputPerSequence += (perSequence - this.outputPerSequence) * OUTPUT_MEAN_WEIGHT;
    }
  }

  /**
   * The output reserved for a non-streamed job at release: its limit (the client's
   * `max_completion_tokens`, else `max_tokens`, as the gateway put it in the payload) for each
   * of its sequences, since the engine generates up to that per sequence; without a limit, the
   * pool's mean output per sequence, rounded.
   */
  expectedOutput(payload: JobPayload): number {
    const perSequence = payload.maxTokens ?? Math.round(this.outputPerSequence);
    return perSequence * sequencesOf(payload);
  }

  /** The run of a released job ended. */
  ended(payload: JobPayload): void {
    const tenant = payload.tenant;
    if (tenant === undefined || !this.inflight.has(tenant)) return;
    const n = Math.max(0, this.inflight.get(tenant)! - 1);
    this.inflight.set(tenant, n);
    this.deps.metrics.tenantInflight.set({ pool: this.deps.pool, tenant }, n);
  }

  /** A job left the queue without running (expired, stalled, cancelled). */
  dropped(jobId: string, payload: JobPayload): void {
    if (payload.tenant !== undefined) this.queues.remove(payload.tenant, jobId);
  }

  /**
   * Output tokens of a running streamed job of `tenant`, as they stream; negative at the end
   * when the engine's usage reports fewer than were counted (output-tokens.ts, `end`): the
   * counter is corrected, the token counter (a Prometheus counter) keeps what streamed.
   */
  output(tenant: string | undefined, tokens: number): void {
    if (tenant === undefined || tokens === 0 || !this.weights.has(tenant)) return;
    if (tokens < 0) {
      this.counter.correctOutput(tenant, -tokens, 0);
      this.dirty = true;
      return;
    }
    this.counter.chargeOutput(tenant, tokens);
    this.dirty = true;
    this.deps.metrics.tenantTokens.inc({ pool: this.deps.pool, tenant, kind: 'output' }, tokens);
  }

  /** Every configured tenant: queued at the last reading, in flight, weight and counter. */
  view(): Record<string, TenantView> {
    const out: Record<string, TenantView> = {};
    for (const [tenant, weight] of this.weights)
      out[tenant] = {
        queued: this.queued.get(tenant) ?? 0,
        inflight: this.inflight.get(tenant) ?? 0,
        weight,
        virtualTokens: this.counter.counter(tenant),
      };
    return out;
  }

  /** A reading of the tenants' queues for the metrics and the view, when no take asked for one. */
  async refresh(): Promise<void> {
    try {
      this.setQueued((await this.queues.read()).tenants);
    } catch {
      // The next take or tick reads again.
    }
  }

  /**
   * This leader hands the pool over while jobs still run: the counters it writes last are
   * what the next leader goes on from, and the settlements of those runs would come after
   * that write, into counters nobody writes again. A reservation still open stays charged, as
   * a run that ends without usage does: giving it back would write a counter lower than the
   * last periodic write, which already held it, and the next leader would go on from a tenant
   * that went back in the order. The reservations are forgotten, so no settlement after the
   * last write corrects counters the next leader already took over.
   */
  handOver(): void {
    this.reserved = new IdTable();
  }

  /** The output reserved for `jobId` (0 when none), forgotten: it is settled once. */
  private takeReserved(jobId: string): number {
    const reserved = this.reserved.get(jobId)?.tokens ?? 0;
    this.reserved.delete(jobId);
    return reserved;
  }

  /** The queues as the last take left them, else a reading of its own (one round trip). */
  private async lastReading(): Promise<TenantQueuesReading> {
    const { metrics, pool } = this.deps;
    const known = await this.afterLastTake;
    this.afterLastTake = undefined;
    if (known) {
      metrics.fairShareReadings.inc({ pool, source: 'ahead' });
      return known;
    }
    metrics.fairShareReadings.inc({ pool, source: 'own' });
    return this.queues.read();
  }

  /** The pick's memory as the last leader wrote it; undefined when absent (an older leader). */
  private readState(stored: Record<string, string>): FairShareState | undefined {
    const active = stored[ACTIVE_FIELD];
    if (active === undefined) return undefined;
    const last = stored[LAST_FIELD];
    return {
      active: active.split(',').filter((t) => this.weights.has(t)),
      ...(last && this.weights.has(last) ? { lastServed: last } : {}),
    };
  }

  private setQueued(tenants: readonly TenantQueue[]): void {
    this.queued = new Map(tenants.map((t) => [t.tenant, t.queued]));
    for (const t of tenants)
      this.deps.metrics.tenantQueued.set({ pool: this.deps.pool, tenant: t.tenant }, t.queued);
  }

  private setCounterMetrics(): void {
    for (const tenant of this.weights.keys())
      this.deps.metrics.tenantVirtualTokens.set(
        { pool: this.deps.pool, tenant },
        this.counter.counter(tenant),
      );
  }
}
