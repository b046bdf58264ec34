import { describe, expect, it } from 'vitest';
import { ProtocolError } from '../src/errors.ts';
import { decodePoolMode, decodePoolStats, encodePoolStats, type PoolStats } from '../src/stats.ts';

const base: PoolStats = { leader: 'd1', at: 1000, drainPerSecond: 0.5, engines: [] };
const decode = (extra: Record<string, unknown>) =>
  decodePoolStats(JSON.stringify({ ...base, ...extra }));

describe('decodePoolStats', () => {
  it('round-trips the mode and the oldest queued age', () => {
    const stats: PoolStats = { ...base, mode: 'paused', oldestQueuedMs: 1234 };
    expect(decodePoolStats(encodePoolStats(stats))).toEqual(stats);
    expect(decode({ mode: 'draining', oldestQueuedMs: 0 })).toMatchObject({
      mode: 'draining',
      oldestQueuedMs: 0,
    });
  });

  it('accepts stats without them (a dispatcher from before they existed)', () => {
    expect(decodePoolStats(encodePoolStats(base))).toEqual(base);
  });

  it('refuses a mode that is not open, paused or draining, naming it', () => {
    expect(() => decode({ mode: 'closed' })).toThrow(ProtocolError);
    expect(() => decode({ mode: 'closed' })).toThrow(
      /mode "closed" is not one of open, paused, draining/,
    );
    expect(() => decode({ mode: 1 })).toThrow(/mode 1/);
  });

  it('refuses an oldest queued age that is not a finite number >= 0', () => {
    for (const bad of [-1, '5', null, true]) {
      expect(() => decode({ oldestQueuedMs: bad })).toThrow(ProtocolError);
      expect(() => decode({ oldestQueuedMs: bad })).toThrow(/oldestQueuedMs must be a number >= 0/);
    }
  });
});

describe('decodePoolMode', () => {
  it('reads an absent key as open and the stored modes as themselves', () => {
    expect(decodePoolMode(null)).toBe('open');
    expect(decodePoolMode('paused')).toBe('paused');
    expect(decodePoolMode('draining')).toBe('draining');
  });

  it('refuses anything else, naming the value', () => {
    expect(() => decodePoolMode('stopped')).toThrow(
      /"stopped" is not one of open, paused, draining/,
    );
  });
});
