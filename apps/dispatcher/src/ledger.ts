// The jobs this dispatcher runs, and the one place in-flight counts change: `begin` when a
// job is released, `complete` when its run ended, however. A job counts as the engine requests
// it becomes (`sequencesOf`). Both are synchronous, so the
// counts the gate reads are exact between any two awaits.
import { gaugeSeries, type DispatcherMetrics, type GaugeSeries } from '@sluice/observability';
import type { JobPayload } from '@sluice/protocol';
import type { Job } from 'bullmq';
import { setPrefillRate, type EngineSlot } from './engine-slot.js';
import { IdTable } from './id-table.js';
import { trackRelease, type PrefillRate, type ReleasedWork } from './prefill-tracker.js';

export interface InflightJob {
  readonly id: string;
  readonly job: Job;
  /** The lock token the job was taken with. */
  readonly token: string;
  readonly engine: EngineSlot;
  readonly payload: JobPayload;
  readonly work: ReleasedWork;
  /** When the runner handed the request to the engine's connection (after its own checks). */
  callStartedAt?: number;
  /** When the first byte of the engine's response body arrived. */
  firstByteAt?: number;
  /**
   * Its outcome was sent to BullMQ (completed or failed): the lock goes with it, so a lock that
   * cannot be extended from then on was not lost (lock-renewal.ts).
   */
  recorded?: true;
}

/**
 * How long a stream handed to the engine may still be on its way there (connect, write, the
 * engine's parse) before a scrape is taken to have counted it anyway. A stream proves sooner
 * that the engine runs it: by its first byte.
 */
export const STREAM_TRANSIT_MS = 1000;

/**
 * The engine requests a job becomes: each of `n` choices and each prompt of a batch is a
 * request of its own in vLLM V1, counted in its running and waiting gauges.
 */
export function sequencesOf(payload: JobPayload): number {
  return payload.sequences ?? 1;
}

export interface LedgerDeps {
  pool: string;
  metrics: DispatcherMetrics;
  prefillRate: PrefillRate;
  now: () => number;
  /** A count the gate or the prefill rules read changed. */
  changed: () => void;
}

export class InflightLedger {
  /** Not a Map: see id-table.ts. */
  private readonly jobs = new IdTable<InflightJob>();
  private idleWaiters: Array<() => void> = [];
  /** Each engine's in-flight series, written on every begin and complete. */
  private readonly engineSeries = new Map<EngineSlot, EngineSeries>();

  constructor(private readonly deps: LedgerDeps) {}

  get size(): number {
    return this.jobs.size;
  }

  get(jobId: string): InflightJob | undefined {
    return this.jobs.get(jobId);
  }

  /** The jobs in flight now (an array of its own). */
  values(): InflightJob[] {
    return this.jobs.values();
  }

  /**
   * How many of this dispatcher's requests on `engine` a scrape sent at `sentAt` surely
   * counted. A job still in the runner's own checks (a Redis round trip, slow on a busy host)
   * is in flight for the cap but not on the engine; counting it as seen would hide as much
   * bypass traffic. A stream handed over just before the scrape may still be on its way (the
   * scrape travels on a warm connection of its own and can overtake it): it counts once its
   * first byte came before the scrape, or once it has been handed over for STREAM_TRANSIT_MS.
   * A non-streaming request shows nothing before its end, so it counts once handed over: the
   * rule for streams would count every short one as bypass traffic and starve the gate.
   */
  onEngineBy(engine: EngineSlot, sentAt: number): number {
    let n = 0;
    for (const e of this.jobs.values()) {
      if (e.engine !== engine || e.callStartedAt === undefined || e.callStartedAt > sentAt)
        continue;
      const surely =
        !e.payload.stream ||
        (e.firstByteAt !== undefined && e.firstByteAt <= sentAt) ||
        e.callStartedAt <= sentAt - STREAM_TRANSIT_MS;
      if (surely) n += sequencesOf(e.payload);
    }
    return n;
  }

  /** Resolves when nothing is in flight. */
  idle(): Promise<void> {
    if (this.jobs.size === 0) return Promise.resolve();
    return new Promise((resolve) => this.idleWaiters.push(resolve));
  }

  /** Counts `job` in flight on `engine`, before anything awaits. */
  begin(
    job: Job,
    token: string,
    engine: EngineSlot,
    payload: JobPayload,
    long: boolean,
  ): InflightJob {
    const { prefillRate, now } = this.deps;
    engine.inflight += sequencesOf(payload);
    const work = trackRelease(engine, {
      long,
      promptTokens: payload.promptTokens ?? 0,
      stream: payload.stream,
      releasedAt: now(),
      rate: prefillRate,
      // Runs when a prompt leaves prefill (a stream's first byte samples the rate) and when
      // the run ends (complete, below).
      changed: () => {
        this.setMetrics(engine);
        setPrefillRate(this.deps.metrics, this.deps.pool, prefillRate);
        this.deps.changed();
      },
    });
    const entry: InflightJob = { id: job.id!, job, token, engine, payload, work };
    this.jobs.set(entry.id, entry);
    this.setMetrics(engine);
    return entry;
  }

  /**
   * The run of `entry` ended; a second call, or one for an entry no longer here, does nothing
   * and answers false.
   */
  complete(entry: InflightJob): boolean {
    if (this.jobs.get(entry.id) !== entry) return false;
    this.jobs.delete(entry.id);
    const { engine } = entry;
    engine.inflight -= sequencesOf(entry.payload);
    // Its `changed` sets the engine's series, the long-prompt counts updated first.
    entry.work.finished();
    if (this.jobs.size === 0) for (const resolve of this.idleWaiters.splice(0)) resolve();
    return true;
  }

  /** `engine`'s in-flight counts: all, long, long in prefill. */
  private setMetrics(engine: EngineSlot): void {
    const { metrics, pool } = this.deps;
    let series = this.engineSeries.get(engine);
    if (!series) {
      const labels = { pool, engine: engine.name };
      series = {
        inflight: gaugeSeries(metrics.inflight, labels),
        longInflight: gaugeSeries(metrics.longInflight, labels),
        longInPrefill: gaugeSeries(metrics.longInPrefill, labels),
      };
      this.engineSeries.set(engine, series);
    }
    series.inflight.set(engine.inflight);
    series.longInflight.set(engine.longInflight);
    series.longInPrefill.set(engine.longInPrefill);
  }
}

interface EngineSeries {
  inflight: GaugeSeries;
  longInflight: GaugeSeries;
  longInPrefill: GaugeSeries;
}
