import { spawn, type ChildProcess } from 'node:child_process';
import { createInterface } from 'node:readline';
import {
  FIRST_READING_TIMEOUT_MS,
  NVIDIA_SMI,
  RESTART_MAX_MS,
  RESTART_MIN_MS,
  SMI_FIRST_LINE_MS,
  SMI_KILL_AFTER_MS,
  SMI_SILENT_POLLS,
} from '../defaults.js';
import { GpuSourceError, messageOf, oneLine } from '../errors.js';
import { createSourceEvents } from '../events.js';
import type { GpuSnapshot, GpuSource } from '../types.js';
import { createSmiBatches } from './batches.js';
import { nvidiaSmiArgs, smiLine } from './csv.js';

export interface NvidiaSmiSourceOptions {
  pollMs: number;
  now: () => number;
  nvidiaSmiPath?: string;
}

/**
 * One long-lived `nvidia-smi --query-gpu=… -lms <pollMs>` process whose CSV lines are read
 * as they arrive (never one spawn per poll: each spawn re-initialises NVML, which costs
 * far more than the query). When it exits it is started again after 1 s, doubling up to
 * 30 s while it keeps failing; a reading resets the delay. A process that prints no line for
 * SMI_SILENT_POLLS poll intervals (SMI_FIRST_LINE_MS at least before its first line) is hung:
 * that is an 'error', and it is killed (SIGTERM, SIGKILL after 2 s) and started again as on
 * an exit. `start()` resolves at the first reading (or after 5 s of silence) and rejects when
 * the executable cannot run or the first process exits before any reading: that is a machine
 * without a working driver. A GPU whose line carries `[N/A]` or `[Not Supported]` (utilization
 * of a MIG-enabled GPU) is left out of every reading from then on, said once in a 'warning'.
 */
export function createNvidiaSmiSource(options: NvidiaSmiSourceOptions): GpuSource {
  const { pollMs, now } = options;
  const path = options.nvidiaSmiPath ?? NVIDIA_SMI;
  const args = nvidiaSmiArgs(pollMs);
  const silentMs = SMI_SILENT_POLLS * pollMs;
  const firstLineMs = Math.max(silentMs, SMI_FIRST_LINE_MS);
  const events = createSourceEvents();
  let state: 'idle' | 'running' | 'stopped' = 'idle';
  let latest: GpuSnapshot | undefined;
  let child: ChildProcess | undefined;
  let childClosed: Promise<void> = Promise.resolve();
  let restartTimer: NodeJS.Timeout | undefined;
  let restartMs = RESTART_MIN_MS;
  let first: { resolve(): void; reject(e: Error): void } | undefined;
  /** GPUs that cannot report a reading (MIG-enabled): left out for the life of the source. */
  const leftOut = new Set<number>();
  let saidNoneLeft = false;

  const warn = (message: string) => {
    if (state === 'running') events.warning(new GpuSourceError('ERR_GPU_UNSUPPORTED', message));
  };

  const batches = createSmiBatches((gpus) => {
    if (state !== 'running') return;
    if (gpus.length === 0 && !saidNoneLeft) {
      saidNoneLeft = true;
      warn(
        'GPU_SOURCE=nvidia-smi: no GPU is left to read (each one reports [N/A] or [Not Supported]); ' +
          'readings carry no GPU, the dispatcher runs without GPU input',
      );
    }
    restartMs = RESTART_MIN_MS;
    latest = { at: now(), gpus };
    first?.resolve();
    events.snapshot(latest);
  });

  function launch() {
    restartTimer = undefined;
    // The last line that was not a reading (stderr, or stdout that did not parse): nvidia-smi
    // prints why it failed ("NVIDIA-SMI has failed because…") on stdout.
    let said = '';
    let ended = false;
    let heard = false;
    let hung = false;
    const proc = spawn(path, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    const closed = new Promise<void>((resolve) => proc.once('close', () => resolve()));
    child = proc;
    childClosed = closed;

    // Every stdout line restarts the watch; silence past it means the process is hung.
    const onSilence = () => {
      if (state !== 'running' || ended) return;
      hung = true;
      const quiet = heard
        ? `${silentMs} ms (${SMI_SILENT_POLLS} poll intervals)`
        : `${firstLineMs} ms since it started`;
      events.error(
        new GpuSourceError(
          'ERR_GPU_PROCESS',
          `GPU_SOURCE=nvidia-smi: ${path} printed nothing for ${quiet}; ` +
            `killing it, restarting in ${restartMs} ms`,
        ),
      );
      void terminate(proc, closed);
    };
    let silence = setTimeout(onSilence, firstLineMs);
    silence.unref();

    createInterface({ input: proc.stdout! }).on('line', (line) => {
      if (state !== 'running' || hung) return;
      if (heard) silence.refresh();
      else {
        // From its first line on, a process is watched at the poll's cadence.
        heard = true;
        clearTimeout(silence);
        silence = setTimeout(onSilence, silentMs);
        silence.unref();
      }
      if (line.trim() === '') return;
      try {
        const parsed = smiLine(line);
        if ('unsupported' in parsed) {
          const { index, uuid, field, value } = parsed.unsupported;
          if (!leftOut.has(index)) {
            leftOut.add(index);
            warn(
              `GPU_SOURCE=nvidia-smi: GPU ${index} (${uuid}) is left out of every reading: ` +
                `${field} is ${value}, as on a MIG-enabled GPU`,
            );
          }
          batches.leftOut(index);
        } else if (leftOut.has(parsed.reading.index)) batches.leftOut(parsed.reading.index);
        else batches.reading(parsed.reading);
      } catch (error) {
        said = line;
        batches.badLine();
        events.error(error as GpuSourceError);
      }
    });
    createInterface({ input: proc.stderr! }).on('line', (line) => {
      if (line.trim() !== '') said = line;
    });

    const end = (reason: string, cause?: unknown) => {
      if (ended) return;
      ended = true;
      clearTimeout(silence);
      if (child === proc) child = undefined;
      batches.reset();
      if (state !== 'running') return;
      const detail = said === '' ? reason : `${reason}: ${oneLine(said).slice(0, 500)}`;
      if (first && !hung) {
        first.reject(
          new GpuSourceError(
            'ERR_GPU_PROCESS',
            `GPU_SOURCE=nvidia-smi: ${detail}; the dispatcher runs without GPU input`,
            { cause },
          ),
        );
        return;
      }
      // A hung process was reported when it was found; start() does not fail for it.
      first?.resolve();
      if (!hung)
        events.error(
          new GpuSourceError(
            'ERR_GPU_PROCESS',
            `GPU_SOURCE=nvidia-smi: ${detail}; restarting in ${restartMs} ms`,
            { cause },
          ),
        );
      restartTimer = setTimeout(launch, restartMs);
      restartTimer.unref();
      restartMs = Math.min(restartMs * 2, RESTART_MAX_MS);
    };
    proc.once('error', (error) => end(`cannot run ${path} (${messageOf(error)})`, error));
    proc.once('close', (code, signal) => end(`${path} exited (${code ?? signal})`));
  }

  return {
    kind: 'nvidia-smi',
    latest: () => latest,
    on: events.on,
    start() {
      if (state !== 'idle')
        return Promise.reject(
          new GpuSourceError('ERR_GPU_OPTIONS', 'GPU_SOURCE=nvidia-smi: a source starts once'),
        );
      state = 'running';
      return new Promise<void>((resolve, reject) => {
        const silence = setTimeout(() => settle(), FIRST_READING_TIMEOUT_MS);
        silence.unref();
        const settle = (error?: Error) => {
          clearTimeout(silence);
          first = undefined;
          if (error) {
            state = 'stopped';
            reject(error);
          } else resolve();
        };
        first = { resolve: () => settle(), reject: settle };
        launch();
      });
    },
    async stop() {
      if (state === 'stopped') return;
      state = 'stopped';
      first?.resolve();
      clearTimeout(restartTimer);
      batches.reset();
      const proc = child;
      if (proc && proc.exitCode === null && proc.signalCode === null)
        await terminate(proc, childClosed);
    },
  };
}

/** SIGTERM, then SIGKILL if the process has not closed SMI_KILL_AFTER_MS later. */
async function terminate(proc: ChildProcess, closed: Promise<void>): Promise<void> {
  proc.kill('SIGTERM');
  const kill = setTimeout(() => proc.kill('SIGKILL'), SMI_KILL_AFTER_MS);
  await closed;
  clearTimeout(kill);
}
