import { GpuSourceError, messageOf } from './errors.js';
import { createSourceEvents } from './events.js';
import type { GpuReading, GpuSnapshot, GpuSource } from './types.js';

/** What a polled source opens at start: a reader, and how to release it. */
export interface PollTarget {
  /** One reading of every GPU; throws (a GpuSourceError, ideally) when it cannot. */
  read(): GpuReading[] | Promise<GpuReading[]>;
  close?(): void | Promise<void>;
}

export interface PollingSourceOptions {
  kind: string;
  pollMs: number;
  now: () => number;
  /**
   * Acquires what reading needs; a rejection here makes `start()` reject. `warn` emits a
   * 'warning' (while the source runs): for facts the target says once, not per poll.
   */
  open(warn: (e: Error) => void): PollTarget | Promise<PollTarget>;
}

/**
 * A source that reads on a timer: the first reading inside `start()`, then one every
 * `pollMs` after the previous one finished (readings never overlap). Timers are unref'd,
 * so a source alone does not keep the process alive. A failed reading emits 'error' and
 * leaves `latest()` as it was.
 */
export function createPollingSource(options: PollingSourceOptions): GpuSource {
  const { kind, pollMs, now } = options;
  const events = createSourceEvents();
  let target: PollTarget | undefined;
  let latest: GpuSnapshot | undefined;
  let timer: NodeJS.Timeout | undefined;
  let inFlight: Promise<void> | undefined;
  let state: 'idle' | 'running' | 'stopped' = 'idle';

  async function readOnce(reader: PollTarget): Promise<void> {
    let gpus: GpuReading[];
    try {
      gpus = await reader.read();
    } catch (error) {
      if (state !== 'running') return;
      events.error(
        error instanceof GpuSourceError
          ? error
          : new GpuSourceError('ERR_GPU_READ', `GPU_SOURCE=${kind}: ${messageOf(error)}`, {
              cause: error,
            }),
      );
      return;
    }
    if (state !== 'running') return;
    latest = { at: now(), gpus };
    events.snapshot(latest);
  }

  function tick(reader: PollTarget) {
    inFlight = readOnce(reader).finally(() => {
      inFlight = undefined;
      if (state !== 'running') return;
      timer = setTimeout(() => tick(reader), pollMs);
      timer.unref();
    });
    return inFlight;
  }

  return {
    kind,
    latest: () => latest,
    on: events.on,
    async start() {
      if (state !== 'idle')
        throw new GpuSourceError('ERR_GPU_OPTIONS', `GPU_SOURCE=${kind}: a source starts once`);
      state = 'running';
      try {
        target = await options.open((e) => {
          if (state === 'running') events.warning(e);
        });
      } catch (error) {
        state = 'stopped';
        throw error;
      }
      if (state !== 'running') {
        await target.close?.();
        return;
      }
      await tick(target);
    },
    async stop() {
      if (state === 'stopped') return;
      state = 'stopped';
      clearTimeout(timer);
      await inFlight;
      await target?.close?.();
      target = undefined;
    },
  };
}
