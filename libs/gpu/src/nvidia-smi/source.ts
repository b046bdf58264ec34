import { spawn, type ChildProcess } from 'node:child_process';
import { createInterface } from 'node:readline';
import {
  FIRST_READING_TIMEOUT_MS,
  NVIDIA_SMI,
  RESTART_MAX_MS,
  RESTART_MIN_MS,
  SMI_KILL_AFTER_MS,
} from '../defaults.js';
import { GpuSourceError, messageOf, oneLine } from '../errors.js';
import { createSourceEvents } from '../events.js';
import type { GpuSnapshot, GpuSource } from '../types.js';
import { createSmiBatches } from './batches.js';
import { nvidiaSmiArgs, parseSmiLine } from './csv.js';

export interface NvidiaSmiSourceOptions {
  pollMs: number;
  now: () => number;
  nvidiaSmiPath?: string;
}

/**
 * One long-lived `nvidia-smi --query-gpu=… -lms <pollMs>` process whose CSV lines are read
 * as they arrive (never one spawn per poll: each spawn re-initialises NVML, which costs
 * far more than the query). When it exits it is started again after 1 s, doubling up to
 * 30 s while it keeps failing; a reading resets the delay. `start()` resolves at the first
 * reading (or after 5 s of silence) and rejects when the executable cannot run or the first
 * process exits before any reading: that is a machine without a working driver.
 */
export function createNvidiaSmiSource(options: NvidiaSmiSourceOptions): GpuSource {
  const { pollMs, now } = options;
  const path = options.nvidiaSmiPath ?? NVIDIA_SMI;
  const args = nvidiaSmiArgs(pollMs);
  const events = createSourceEvents();
  let state: 'idle' | 'running' | 'stopped' = 'idle';
  let latest: GpuSnapshot | undefined;
  let child: ChildProcess | undefined;
  let childClosed: Promise<void> = Promise.resolve();
  let restartTimer: NodeJS.Timeout | undefined;
  let restartMs = RESTART_MIN_MS;
  let first: { resolve(): void; reject(e: Error): void } | undefined;

  const batches = createSmiBatches((gpus) => {
    if (state !== 'running') return;
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
    const proc = spawn(path, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    child = proc;
    childClosed = new Promise((resolve) => proc.once('close', () => resolve()));

    createInterface({ input: proc.stdout! }).on('line', (line) => {
      if (state !== 'running' || line.trim() === '') return;
      try {
        batches.reading(parseSmiLine(line));
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
      if (child === proc) child = undefined;
      batches.reset();
      if (state !== 'running') return;
      const detail = said === '' ? reason : `${reason}: ${oneLine(said).slice(0, 500)}`;
      if (first) {
        first.reject(
          new GpuSourceError(
            'ERR_GPU_PROCESS',
            `GPU_SOURCE=nvidia-smi: ${detail}; the dispatcher runs without GPU input`,
            { cause },
          ),
        );
        return;
      }
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
      if (proc && proc.exitCode === null && proc.signalCode === null) {
        proc.kill('SIGTERM');
        const kill = setTimeout(() => proc.kill('SIGKILL'), SMI_KILL_AFTER_MS);
        await childClosed;
        clearTimeout(kill);
      }
    },
  };
}
