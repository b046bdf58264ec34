// Drives the scheduler in scaled wall-clock time.
//
// Simulated time advances by each step's modelled duration, not by how late a timer
// fired: a step that ends in the simulated past is applied at once, and the loop catches
// up in a burst. So at `--time-scale 1000` a 40 ms decode step costs 0.04 ms of wall
// clock on average, and timings (TTFT, queue time) follow the cost model rather than the
// 1 ms granularity of Node's timers. While idle, simulated time follows the wall clock.
import { performance } from 'node:perf_hooks';
import type { Scheduler, Step, StepResult } from './scheduler.js';

/** Steps applied in one macrotask before yielding to I/O (matters for the instant profile). */
const STEPS_PER_TURN = 256;

export interface SimClock {
  /** Simulated seconds since the engine started, from the wall clock. */
  now(): number;
  /** Unix time, in seconds, at which the engine started. */
  readonly startedAtEpoch: number;
}

export function createClock(timeScale: number): SimClock {
  const origin = performance.now();
  return {
    now: () => ((performance.now() - origin) / 1000) * timeScale,
    startedAtEpoch: Date.now() / 1000,
  };
}

export class EngineLoop {
  /** End of the last applied step, simulated seconds. */
  private cursor = 0;
  private current: Step | undefined;
  private timer: NodeJS.Timeout | undefined;
  private immediate: NodeJS.Immediate | undefined;
  private closed = false;
  private held = false;

  constructor(
    readonly scheduler: Scheduler,
    readonly clock: SimClock,
    private readonly timeScale: number,
    private readonly onStep: (result: StepResult) => void = () => {},
  ) {}

  /**
   * Simulated arrival time of a request entering now. While the loop is catching up on
   * steps whose end has already passed (the simulator is CPU bound, as with the instant
   * profile, whose steps take no simulated time at all), the engine's present is the end of
   * its last step, and a request arriving now joins the very next step.
   */
  arrivalTime(): number {
    const catchingUp = this.immediate !== undefined && this.current === undefined;
    return catchingUp ? this.cursor : Math.max(this.clock.now(), this.cursor);
  }

  /** A step has started and not ended yet (its end is in the future, or it is held). */
  get stepInFlight(): boolean {
    return this.current !== undefined;
  }

  /**
   * Holds the loop: the step in flight does not end, and no other starts, until `hold(false)`.
   * A step slower than anything else (a long prefill chunk on slow hardware, a GPU hang) for
   * the `holdStep` fault. The held step ends when released: it lasted that long.
   */
  hold(on: boolean): void {
    this.held = on;
    if (on || this.closed) return;
    const step = this.current;
    if (step) step.duration = Math.max(step.duration, this.clock.now() - step.start);
    if (this.timer === undefined && this.immediate === undefined)
      this.immediate = setImmediate(this.pump);
  }

  /** Call after adding work to the scheduler. */
  wake(): void {
    if (this.closed || this.current || this.timer || this.immediate) return;
    this.immediate = setImmediate(this.pump);
  }

  close(): void {
    this.closed = true;
    clearTimeout(this.timer);
    if (this.immediate) clearImmediate(this.immediate);
  }

  private readonly pump = (): void => {
    this.timer = undefined;
    this.immediate = undefined;
    if (this.held) return; // hold(false) pumps again
    if (this.current) {
      this.apply(this.current);
      this.current = undefined;
    }
    for (let n = 0; n < STEPS_PER_TURN; n += 1) {
      if (this.closed) return;
      const start = this.scheduler.nextStart(this.cursor);
      if (start === undefined) return; // idle until wake()
      const step = this.scheduler.schedule(start);
      if (step === undefined) return;
      const end = step.start + step.duration;
      const realNow = this.clock.now();
      if (end > realNow) {
        this.current = step;
        this.timer = setTimeout(this.pump, ((end - realNow) / this.timeScale) * 1000);
        return;
      }
      this.apply(step);
    }
    this.immediate = setImmediate(this.pump);
  };

  private apply(step: Step): void {
    this.cursor = step.start + step.duration;
    this.onStep(this.scheduler.complete(step));
  }
}
