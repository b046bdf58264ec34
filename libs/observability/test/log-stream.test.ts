// The per-turn log stream on real file descriptors: a turn's lines reach the file in one
// write once the turn is over, a line is never held into a later turn, and a process that
// exits in the middle of a turn still writes the lines it made.
import { spawn } from 'node:child_process';
import fs, { closeSync, mkdtempSync, openSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { logStreamPerTurn } from '../src/log-stream.ts';

let dir: string;
let file: string;
let fd: number;

beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), 'log-stream-'));
  file = join(dir, 'out.log');
  fd = openSync(file, 'a');
});
afterEach(() => {
  vi.restoreAllMocks();
  closeSync(fd);
  rmSync(dir, { recursive: true, force: true });
});

const endOfTurn = () => new Promise((resolve) => setImmediate(resolve));

describe('logStreamPerTurn', () => {
  it("writes one turn's lines together, once the turn is over", async () => {
    const writes = vi.spyOn(fs, 'writeSync');
    const stream = logStreamPerTurn(fd);
    stream.write('{"n":1}\n');
    stream.write('{"n":2}\n');
    stream.write('{"n":3}\n');
    expect(readFileSync(file, 'utf8')).toBe('');
    await endOfTurn();
    expect(readFileSync(file, 'utf8')).toBe('{"n":1}\n{"n":2}\n{"n":3}\n');
    expect(writes.mock.calls.filter(([target]) => target === fd)).toHaveLength(1);
  });

  it('writes the next turn on its own, in order', async () => {
    const stream = logStreamPerTurn(fd);
    stream.write('a\n');
    await endOfTurn();
    stream.write('b\n');
    await endOfTurn();
    expect(readFileSync(file, 'utf8')).toBe('a\nb\n');
  });

  it('writes at once what goes past the buffer, without waiting for the turn', () => {
    const stream = logStreamPerTurn(fd);
    const line = `${'x'.repeat(1023)}\n`;
    for (let i = 0; i < 9; i += 1) stream.write(line);
    expect(readFileSync(file, 'utf8').length).toBeGreaterThanOrEqual(8192);
  });

  it("writes a turn's lines when the process exits in the middle of it", async () => {
    // The built module (npm run build), as every process runs it.
    const module = fileURLToPath(new URL('../dist/log-stream.js', import.meta.url));
    const child = spawn(
      process.execPath,
      [
        '--input-type=module',
        '-e',
        `const { stdoutPerTurn } = await import(${JSON.stringify(module)});
         const s = stdoutPerTurn(); s.write('first\\n'); s.write('last\\n'); process.exit(3);`,
      ],
      { stdio: ['ignore', 'pipe', 'inherit'] },
    );
    let out = '';
    child.stdout.on('data', (chunk: Buffer) => (out += chunk.toString()));
    const code = await new Promise((resolve) => child.on('close', resolve));
    expect(code).toBe(3);
    expect(out).toBe('first\nlast\n');
  });
});
