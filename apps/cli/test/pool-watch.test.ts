// The pure parts of `sluice pool` and `sluice status --watch`: strict flags, the lines printed,
// frames drawn in place on a terminal and appended elsewhere.
import { describe, expect, it } from 'vitest';
import { doneLine, parsePoolArgs, UsageError } from '../src/pool.ts';
import { paint, renderFrame, watchStatus } from '../src/status-watch.ts';
import { formatStatus, parseStatusArgs, StatusUsageError } from '../src/status.ts';
import type { PoolStats } from '@sluice/protocol';

const stats: PoolStats = {
  leader: 'd1',
  at: 10_000,
  drainPerSecond: 0,
  mode: 'paused',
  oldestQueuedMs: 2345,
  queue: { wait: 0, prioritized: 3, active: 0, delayed: 1 },
  engines: [{ name: 'e', inflight: 0, cap: 2, open: true, health: 'healthy' }],
};

describe('sluice pool arguments', () => {
  it('reads an action, a pool and the timeout', () => {
    expect(parsePoolArgs(['pause', 'chat'])).toEqual({
      action: 'pause',
      pool: 'chat',
      timeoutMs: 10_000,
    });
    expect(parsePoolArgs(['drain', 'chat', '--timeout', '2.5'])).toMatchObject({
      action: 'drain',
      timeoutMs: 2500,
    });
    expect(parsePoolArgs(['--help'])).toBe('help');
  });

  it.each([
    [['pause', 'chat', '--force'], /Unknown option '--force'/],
    [['stop', 'chat'], /unknown action "stop": expected pause, resume or drain/],
    [[], /expected an action/],
    [['resume'], /expected the pool to resume/],
    [['pause', 'a', 'b'], /unexpected argument "b"/],
    [['pause', 'a', '--timeout', '0'], /--timeout="0" is invalid: expected seconds > 0/],
    [['pause', 'a', '--timeout'], /argument missing/],
  ])('refuses %j with one clear line', (argv, message) => {
    expect(() => parsePoolArgs(argv)).toThrow(UsageError);
    expect(() => parsePoolArgs(argv)).toThrow(message);
  });

  it('says what the new mode does, with the leader and the queue', () => {
    expect(doneLine('chat', 'paused', stats)).toBe(
      'pool chat paused: the leader releases nothing; requests queue up to the bound (leader d1, 4 queued)\n',
    );
    expect(doneLine('chat', 'draining', { ...stats, queue: undefined })).toBe(
      'pool chat draining: gateways refuse new requests; the leader finishes the queue (leader d1)\n',
    );
  });
});

describe('sluice status arguments', () => {
  it('reads --json, --watch and --interval', () => {
    expect(parseStatusArgs([])).toEqual({ json: false });
    expect(parseStatusArgs(['--json'])).toEqual({ json: true });
    expect(parseStatusArgs(['--watch'])).toEqual({ json: false, watchMs: 1000 });
    expect(parseStatusArgs(['-w', '--interval', '0.5'])).toEqual({ json: false, watchMs: 500 });
    expect(parseStatusArgs(['-w', '--interval', '3600'])).toEqual({
      json: false,
      watchMs: 3_600_000,
    });
  });

  it.each([
    [['--bogus'], /Unknown option '--bogus'/],
    [['extra'], /Unexpected argument 'extra'/],
    [['--interval', '2'], /--interval goes with --watch/],
    [['--watch', '--json'], /do not go together/],
    [
      ['--watch', '--interval', 'x'],
      /--interval="x" is invalid: expected seconds from 0.1 to 3600/,
    ],
    [['--watch', '--interval', '0.05'], /--interval="0.05" is invalid/],
    // Past 2^31-1 ms a timer fires after 1 ms: the view would read Redis in a tight loop.
    [['--watch', '--interval', '2200000'], /--interval="2200000" is invalid/],
    [['--watch', '--interval', '3600.5'], /--interval="3600.5" is invalid/],
  ])('refuses %j with one clear line', (argv, message) => {
    expect(() => parseStatusArgs(argv)).toThrow(StatusUsageError);
    expect(() => parseStatusArgs(argv)).toThrow(message);
  });
});

describe('status view', () => {
  it('shows the mode and the age of the oldest queued job', () => {
    expect(formatStatus([{ pool: 'chat', stats }], 10_000).split('\n')[0]).toBe(
      'pool chat  mode paused  leader d1  drain 0.00/s  queue: wait 0 prioritized 3 active 0 held 1  oldest 2.3 s',
    );
  });

  it('puts the time and the interval above the status, or says why it could not read', () => {
    const frame = renderFrame({ head: 'redis: x\n', pools: [{ pool: 'chat', stats }] }, 0, 1000);
    expect(frame.split('\n').slice(0, 3)).toEqual([
      'sluice status  00:00:00.000 UTC  every 1 s  (Ctrl-C to quit)',
      'redis: x',
      expect.stringMatching(/^pool chat {2}mode paused/),
    ]);
    expect(renderFrame(new Error('Redis is away'), 0, 500)).toBe(
      'sluice status  00:00:00.000 UTC  every 0.5 s  (Ctrl-C to quit)\ncannot read the status: Redis is away\n',
    );
  });

  it('draws over the last frame on a terminal and appends frames elsewhere', () => {
    expect(paint('a\nb\n', true)).toBe('\u001b[Ha\u001b[K\nb\u001b[K\n\u001b[J');
    expect(paint('a\nb\n', false)).toBe('a\nb\n\n');
  });

  it('redraws until stopped, a failed read included, and restores the cursor', async () => {
    const written: string[] = [];
    let reads = 0;
    let stop!: () => void;
    const stopped = new Promise<void>((r) => (stop = r));
    await watchStatus({
      intervalMs: 1,
      out: { isTTY: true, write: (t) => written.push(t) },
      now: () => 0,
      stop: stopped,
      read: async () => {
        reads += 1;
        if (reads === 2) throw new Error('gone');
        // Ctrl-C during a read that never ends: the view ends all the same.
        if (reads === 4) {
          stop();
          return new Promise<never>(() => {});
        }
        return { head: '', pools: [] };
      },
    });
    expect(written[0]).toBe('\u001b[?25l\u001b[2J');
    expect(written.slice(1, -1)).toHaveLength(3);
    expect(written[2]).toMatch(/cannot read the status: gone/);
    expect(written.at(-1)).toBe('\u001b[?25h');
  });
});
