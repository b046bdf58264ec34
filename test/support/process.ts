// Starts a real child process and resolves once it prints a line matching `ready`.
// Readiness is an event the process reports, never a sleep.
import { spawn, type ChildProcess } from 'node:child_process';
import { basename } from 'node:path';
import { createInterface } from 'node:readline';
import { logProcess } from './process-log.ts';

export interface StartedProcess {
  readonly child: ChildProcess;
  /** The match of the `ready` pattern. */
  readonly ready: RegExpMatchArray;
  /** Every line the process wrote so far (stdout and stderr), for assertions and failures. */
  readonly output: string[];
  /** The lines it wrote on stderr only. */
  readonly stderr: string[];
  /** Resolves once it has exited and its output is read to the end, with its exit code or signal. */
  readonly closed: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  /** Resolves with the first line matching `pattern` written after this call (or already written). */
  waitForLine(pattern: RegExp, timeoutMs?: number): Promise<RegExpMatchArray>;
  /** Sends `signal` and resolves when the process has exited. */
  stop(signal?: NodeJS.Signals): Promise<void>;
}

export interface StartOptions {
  command: string;
  args?: string[];
  /** How a failed test's output names it (default: the command's file name). */
  name?: string;
  env?: Record<string, string | undefined>;
  cwd?: string;
  ready: RegExp;
  timeoutMs?: number;
  /**
   * false: once the ready line is in, the output is drained and dropped, not kept or matched
   * (default true). For a benchmark, whose load generator runs in this process: a gateway's
   * access log line per request would cost the client a wake-up and a line split per request,
   * and memory that only grows, which direct requests never pay.
   */
  keepOutput?: boolean;
}

export async function startProcess(options: StartOptions): Promise<StartedProcess> {
  const child = spawn(options.command, options.args ?? [], {
    cwd: options.cwd,
    env: { ...process.env, ...options.env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const output: string[] = [];
  const stderr: string[] = [];
  const watchers = new Set<{ pattern: RegExp; resolve: (m: RegExpMatchArray) => void }>();
  const logged = logProcess({
    name: options.name ?? basename(options.command),
    pid: child.pid,
    output,
  });
  const exited = new Promise<void>((resolve) =>
    child.once('exit', () => {
      logged();
      resolve();
    }),
  );
  // 'close' comes after the last 'line' of both streams.
  const closed = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    child.once('close', (code, signal) => resolve({ code, signal })),
  );

  let dropping = false;
  const readers = [child.stdout!, child.stderr!].map((stream) => {
    const reader = createInterface({ input: stream });
    reader.on('line', (line) => {
      if (dropping) return;
      output.push(line);
      if (stream === child.stderr) stderr.push(line);
      for (const watcher of watchers) {
        const match = line.match(watcher.pattern);
        if (match) {
          watchers.delete(watcher);
          watcher.resolve(match);
        }
      }
      // Here, not once the ready promise has settled: lines later in the same chunk come first.
      if (options.keepOutput === false && options.ready.test(line)) dropOutput();
    });
    return reader;
  });
  function dropOutput() {
    dropping = true;
    for (const reader of readers) reader.close();
    child.stdout!.resume();
    child.stderr!.resume();
  }

  function waitForLine(pattern: RegExp, timeoutMs = options.timeoutMs ?? 20_000) {
    if (dropping)
      return Promise.reject(
        new Error(`${options.command}: its output is not kept (keepOutput: false)`),
      );
    for (const line of output) {
      const match = line.match(pattern);
      if (match) return Promise.resolve(match);
    }
    return new Promise<RegExpMatchArray>((resolve, reject) => {
      const watcher = {
        pattern,
        resolve: (m: RegExpMatchArray) => {
          clearTimeout(timer);
          resolve(m);
        },
      };
      const fail = (why: string) => {
        watchers.delete(watcher);
        clearTimeout(timer);
        reject(
          new Error(`${options.command} ${why} before printing ${pattern}:\n${output.join('\n')}`),
        );
      };
      const timer = setTimeout(() => fail(`did not print within ${timeoutMs} ms`), timeoutMs);
      watchers.add(watcher);
      void exited.then(() => {
        if (watchers.has(watcher)) fail(`exited (${child.exitCode ?? child.signalCode})`);
      });
    });
  }

  async function stop(signal: NodeJS.Signals = 'SIGTERM') {
    if (child.exitCode !== null || child.signalCode !== null) return;
    child.kill(signal);
    await exited;
  }

  try {
    const ready = await waitForLine(options.ready);
    return { child, ready, output, stderr, closed, waitForLine, stop };
  } catch (err) {
    await stop('SIGKILL');
    throw err;
  }
}
