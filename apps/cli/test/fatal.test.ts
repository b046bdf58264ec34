import { createServer, type Server } from 'node:net';
import { describe, expect, it } from 'vitest';
import { strictFlags, UsageError } from '../src/args.ts';
import { fatalLine } from '../src/fatal.ts';

/** The error Node gives a second server on the port of `first`. */
async function listenError(host: string): Promise<{ error: Error; port: number; close(): void }> {
  const first: Server = createServer();
  await new Promise<void>((resolve) => first.listen(0, host, resolve));
  const port = (first.address() as { port: number }).port;
  const error = await new Promise<Error>((resolve) =>
    createServer().once('error', resolve).listen(port, host),
  );
  return { error, port, close: () => first.close() };
}

describe('fatalLine', () => {
  it('names the address and the reason of a listen error, without Node prefix', async () => {
    const { error, port, close } = await listenError('127.0.0.1');
    close();
    expect(fatalLine('gateway', error)).toBe(
      `sluice gateway: cannot listen on 127.0.0.1:${port}: address already in use`,
    );
  });

  it('brackets an IPv6 address', () => {
    const error = Object.assign(new Error('listen EACCES: permission denied ::1:80'), {
      syscall: 'listen',
      address: '::1',
      port: 80,
    });
    expect(fatalLine('dispatcher', error)).toBe(
      'sluice dispatcher: cannot listen on [::1]:80: permission denied',
    );
  });

  it('keeps any other message as it is', () => {
    expect(fatalLine('status', new Error('Redis did not answer'))).toBe(
      'sluice status: Redis did not answer',
    );
    expect(fatalLine(undefined, 'odd')).toBe('sluice: odd');
  });
});

describe('strictFlags', () => {
  it('accepts declared flags and --help', () => {
    expect(strictFlags('x', ['--json', '-h'], { json: { type: 'boolean' } })).toEqual({
      json: true,
      help: true,
    });
  });

  it.each([
    [['--bogus'], 'sluice x: unknown flag --bogus (see sluice x --help)'],
    [['word'], 'sluice x: unexpected argument "word" (see sluice x --help)'],
  ])('refuses %j in one line', (argv, line) => {
    expect(() => strictFlags('x', argv, {})).toThrow(new UsageError(line));
  });
});
