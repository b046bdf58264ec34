import { chmodSync, existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import {
  createGpuSource,
  GpuSourceError,
  nvidiaSmiArgs,
  parseSmiLine,
  type GpuSource,
} from '../src/index.ts';
import { MiB, record, tempDir } from './helpers.ts';

const ARGS = [
  '--query-gpu=index,uuid,utilization.gpu,memory.used,memory.total',
  '--format=csv,noheader,nounits',
  '-lms',
];

type Behaviour =
  /** Prints two GPUs every -lms ms until killed. */
  | 'steady'
  /** First run: two samples, exit 1 right after the second. Later runs: steady. */
  | 'dies-once'
  /** What nvidia-smi prints on a machine without a working driver. */
  | 'no-driver'
  /** GPU 0 answers [N/A] for utilization.gpu (a MIG-enabled GPU), GPU 1 reads. */
  | 'not-available'
  /** Both GPUs answer [Not Supported] for utilization.gpu. */
  | 'none-available'
  /** A line of four fields for GPU 0. */
  | 'garbled'
  /**
   * First run: two samples, then silence without exiting, and SIGTERM is logged and
   * ignored (a process stuck on a wedged driver). Later runs: steady.
   */
  | 'hangs';

const dir = tempDir('smi');
afterAll(() => dir.remove());

/**
 * A stand-in nvidia-smi: a node script that checks it got the arguments the real one
 * needs, logs each start (its argv as one JSON line) and each signal it is sent but
 * survives, and prints CSV like the real one.
 */
function standIn(behaviour: Behaviour): {
  path: string;
  starts(): string[][];
  signals(): string[];
} {
  const name = `nvidia-smi-${behaviour}-${Math.random().toString(36).slice(2)}`;
  const path = join(dir.path, name);
  const log = `${path}.log`;
  const signalLog = `${path}.signals`;
  writeFileSync(
    path,
    `#!${process.execPath}
const fs = require('node:fs');
const args = process.argv.slice(2);
fs.appendFileSync(${JSON.stringify(log)}, JSON.stringify(args) + '\\n');
const runs = fs.readFileSync(${JSON.stringify(log)}, 'utf8').trim().split('\\n').length;
const expected = ${JSON.stringify(ARGS)};
if (args.length !== 4 || expected.some((a, i) => args[i] !== a) || !/^\\d+$/.test(args[3])) {
  process.stderr.write('Invalid combination of input arguments. Please run nvidia-smi -h for help.\\n');
  process.exit(2);
}
const behaviour = ${JSON.stringify(behaviour)};
if (behaviour === 'no-driver') {
  process.stdout.write("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running.\\n\\n");
  process.exit(9);
}
if (behaviour === 'hangs' && runs === 1)
  process.on('SIGTERM', () => fs.appendFileSync(${JSON.stringify(signalLog)}, 'SIGTERM\\n'));
let n = 0;
function sample() {
  n++;
  if (behaviour === 'hangs' && runs === 1 && n > 2) return;
  const util =
    behaviour === 'not-available' ? '[N/A]' :
    behaviour === 'none-available' ? '[Not Supported]' :
    String(30 + (n % 10));
  process.stdout.write(
    (behaviour === 'garbled'
      ? '0, GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52, 37, 20480\\n'
      : '0, GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52, ' + util + ', 20480, 81559\\n') +
    '1, GPU-1c2e8d4b-0f7a-5b39-84c6-3e9a1d7f2b60, ' +
    (behaviour === 'none-available' ? util : '91') + ', 133120, 143771\\n',
  );
  // Stdout to a pipe is written synchronously: both lines are out before the exit.
  if (behaviour === 'dies-once' && runs === 1 && n === 2) process.exit(1);
}
sample();
setInterval(sample, Number(args[3]));
`,
  );
  chmodSync(path, 0o755);
  return {
    path,
    starts: () =>
      readFileSync(log, 'utf8')
        .trim()
        .split('\n')
        .map((line) => JSON.parse(line) as string[]),
    signals: () =>
      existsSync(signalLog) ? readFileSync(signalLog, 'utf8').trim().split('\n') : [],
  };
}

describe('GPU_SOURCE=nvidia-smi with a stand-in executable', () => {
  let source: GpuSource | undefined;
  let clock = 1_700_000_000_000;
  const now = () => clock;

  afterEach(async () => {
    await source?.stop();
    source = undefined;
  });

  // 100 ms polls: the silence watch (5 polls) then waits 500 ms, which a stand-in starved of
  // CPU on a loaded machine does not reach between two samples; at 30 ms it would be 150 ms.
  function smi(nvidiaSmiPath: string, pollMs = 100) {
    source = createGpuSource({ source: 'nvidia-smi', nvidiaSmiPath, pollMs, now })!;
    return source;
  }

  it('runs ONE long-lived process with the query arguments and reads each sample as it arrives', async () => {
    const fake = standIn('steady');
    const gpu = smi(fake.path);
    expect(gpu.kind).toBe('nvidia-smi');
    const events = record(gpu);
    await gpu.start();
    expect(gpu.latest()).toBe(events.snapshots.at(-1));
    expect(events.snapshots[0]).toEqual({
      at: clock,
      gpus: [
        {
          index: 0,
          uuid: 'GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52',
          utilization: 0.31,
          memoryUsed: 20480 * MiB,
          memoryTotal: 81559 * MiB,
        },
        {
          index: 1,
          uuid: 'GPU-1c2e8d4b-0f7a-5b39-84c6-3e9a1d7f2b60',
          utilization: 0.91,
          memoryUsed: 133120 * MiB,
          memoryTotal: 143771 * MiB,
        },
      ],
    });
    while (events.snapshots.length < 5) {
      clock += 100;
      await events.nextSnapshot();
    }
    // Consecutive samples, each complete: utilization of GPU 0 steps 0.31, 0.32, 0.33…
    const util0 = events.snapshots.map((s) => s.gpus[0]!.utilization);
    expect(util0.slice(0, 4)).toEqual([0.31, 0.32, 0.33, 0.34]);
    expect(events.snapshots.every((s) => s.gpus.length === 2)).toBe(true);
    expect(fake.starts()).toEqual([[...ARGS, '100']]);
    expect(events.errors).toEqual([]);
  });

  it('restarts it with backoff when it exits, keeping the last snapshot meanwhile', async () => {
    const fake = standIn('dies-once');
    // It exits as it prints its second sample, and the silence watch (5 polls) would call it
    // hung only 1.5 s after that: the exit wins on a loaded machine too. (At 100 ms polls,
    // with the exit one poll after the sample, the watch won under two CI runs at once, and at
    // 30 ms polls under one: "printed nothing for 150 ms".)
    const gpu = smi(fake.path, 300);
    const events = record(gpu);
    await gpu.start();
    const error = await events.nextError();
    expect(error).toMatchObject({
      code: 'ERR_GPU_PROCESS',
      message: `GPU_SOURCE=nvidia-smi: ${fake.path} exited (1); restarting in 1000 ms`,
    });
    const kept = gpu.latest()!;
    expect(kept).toBe(events.snapshots.at(-1));
    expect(events.snapshots.length).toBe(2);
    clock += 1000;
    const after = await events.nextSnapshot(5000);
    expect(after.at).toBe(clock);
    expect(after.gpus).toHaveLength(2);
    expect(fake.starts()).toEqual([
      [...ARGS, '300'],
      [...ARGS, '300'],
    ]);
  });

  it('kills a process that stops printing (SIGKILL when SIGTERM does not end it) and starts another', async () => {
    const fake = standIn('hangs');
    const gpu = smi(fake.path, 100);
    const events = record(gpu);
    await gpu.start();
    const error = await events.nextError();
    expect(error).toMatchObject({
      code: 'ERR_GPU_PROCESS',
      message: `GPU_SOURCE=nvidia-smi: ${fake.path} printed nothing for 500 ms (5 poll intervals); killing it, restarting in 1000 ms`,
    });
    expect(events.snapshots).toHaveLength(2);
    expect(gpu.latest()).toBe(events.snapshots[1]);
    clock += 5000;
    // SIGTERM is ignored, SIGKILL ends it 2 s later, and the next process starts 1 s after.
    const after = await events.nextSnapshot(15_000);
    expect(after.at).toBe(clock);
    expect(after.gpus).toHaveLength(2);
    expect(fake.signals()).toEqual(['SIGTERM']);
    expect(fake.starts()).toEqual([
      [...ARGS, '100'],
      [...ARGS, '100'],
    ]);
    // The hang is one error line; the exit it caused is not a second one.
    expect(events.errors).toEqual([error]);
  });

  it('leaves out a GPU that answers [N/A] (MIG), says so once, and reads the others', async () => {
    const fake = standIn('not-available');
    const gpu = smi(fake.path);
    const events = record(gpu);
    await gpu.start();
    expect(gpu.latest()!.gpus.map((g) => [g.index, g.utilization])).toEqual([[1, 0.91]]);
    expect(events.warnings).toHaveLength(1);
    expect(events.warnings[0]).toMatchObject({
      code: 'ERR_GPU_UNSUPPORTED',
      message:
        'GPU_SOURCE=nvidia-smi: GPU 0 (GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52) is left out of every reading: utilization.gpu is [N/A], as on a MIG-enabled GPU',
    });
    for (let i = 0; i < 3; i++) {
      clock += 100;
      const next = await events.nextSnapshot();
      expect(next.at).toBe(clock);
      expect(next.gpus.map((g) => g.index)).toEqual([1]);
    }
    expect(events.warnings).toHaveLength(1);
    expect(events.errors).toEqual([]);
  });

  it('reads no GPU when every GPU answers [Not Supported], and says so once', async () => {
    const fake = standIn('none-available');
    const gpu = smi(fake.path);
    const events = record(gpu);
    await gpu.start();
    expect(gpu.latest()).toEqual({ at: clock, gpus: [] });
    for (let i = 0; i < 3; i++) expect((await events.nextSnapshot()).gpus).toEqual([]);
    expect(events.warnings.map((w) => w.message)).toEqual([
      expect.stringContaining('GPU 0 (GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52) is left out'),
      expect.stringContaining('GPU 1 (GPU-1c2e8d4b-0f7a-5b39-84c6-3e9a1d7f2b60) is left out'),
      'GPU_SOURCE=nvidia-smi: no GPU is left to read (each one reports [N/A] or [Not Supported]); readings carry no GPU, the dispatcher runs without GPU input',
    ]);
    expect(events.errors).toEqual([]);
  });

  it('reports a line it cannot use and drops that sample', async () => {
    const fake = standIn('garbled');
    const gpu = smi(fake.path);
    const events = record(gpu);
    void gpu.start();
    const error = await events.nextError();
    expect(error).toMatchObject({
      code: 'ERR_GPU_PARSE',
      message:
        'GPU_SOURCE=nvidia-smi: expected 5 fields (index, uuid, utilization.gpu, memory.used, memory.total) in line "0, GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52, 37, 20480"',
    });
    await events.nextError();
    expect(gpu.latest()).toBeUndefined();
    expect(events.snapshots).toEqual([]);
  });

  it('rejects start with one line when nvidia-smi fails before its first reading', async () => {
    const fake = standIn('no-driver');
    await expect(smi(fake.path).start()).rejects.toMatchObject({
      code: 'ERR_GPU_PROCESS',
      message: `GPU_SOURCE=nvidia-smi: ${fake.path} exited (9): NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running.; the dispatcher runs without GPU input`,
    });
    expect(fake.starts()).toHaveLength(1);
  });

  it('rejects start with one line when the executable is missing', async () => {
    const missing = join(dir.path, 'no-such-nvidia-smi');
    const error = await smi(missing)
      .start()
      .then(
        () => undefined,
        (e: unknown) => e,
      );
    expect(error).toBeInstanceOf(GpuSourceError);
    expect(error).toMatchObject({
      code: 'ERR_GPU_PROCESS',
      message: `GPU_SOURCE=nvidia-smi: cannot run ${missing} (spawn ${missing} ENOENT); the dispatcher runs without GPU input`,
    });
  });

  it('stops the process on stop', async () => {
    const fake = standIn('steady');
    const gpu = smi(fake.path);
    const events = record(gpu);
    await gpu.start();
    await gpu.stop();
    const count = events.snapshots.length;
    await new Promise((resolve) => setTimeout(resolve, 150));
    expect(events.snapshots.length).toBe(count);
    expect(events.errors).toEqual([]);
    expect(fake.starts()).toHaveLength(1);
  });
});

describe('nvidia-smi CSV', () => {
  it('asks for the fields it parses, looping every pollMs', () => {
    expect(nvidiaSmiArgs(250)).toEqual([...ARGS, '250']);
  });

  it('parses a line in MiB into bytes and a fraction', () => {
    expect(
      parseSmiLine('3, GPU-e7d6c5b4-a392-4180-b7f6-e5d4c3b2a190, 100, 143000, 143771'),
    ).toEqual({
      index: 3,
      uuid: 'GPU-e7d6c5b4-a392-4180-b7f6-e5d4c3b2a190',
      utilization: 1,
      memoryUsed: 143000 * MiB,
      memoryTotal: 143771 * MiB,
    });
  });

  it('refuses lines that are not one GPU', () => {
    expect(() => parseSmiLine('0, GPU-x, 37, 20480')).toThrow(/expected 5 fields/);
    expect(() => parseSmiLine('0, GPU-x, [Not Supported], 1, 2')).toThrow(
      /utilization.gpu is \[Not Supported\]/,
    );
    expect(() => parseSmiLine('0, GPU-x, 137, 1, 2')).toThrow(/utilization \(percent\) 137/);
  });
});
