import { describe, expect, it } from 'vitest';
import { allowedPools, poolsToContend, type LeaseChoice } from '../src/lease-choice.ts';

const choice = (over: Partial<LeaseChoice>): LeaseChoice => ({
  allowed: ['a', 'b', 'c'],
  leading: new Set(),
  trying: new Set(),
  limit: undefined,
  ...over,
});

describe('allowedPools', () => {
  const pools = [{ name: 'a' }, { name: 'b' }, { name: 'c' }];

  it('keeps every configured pool when SLUICE_POOLS is unset', () => {
    expect(allowedPools(pools, undefined)).toEqual(pools);
  });

  it('keeps only the listed pools, in config order', () => {
    expect(allowedPools(pools, ['c', 'a'])).toEqual([{ name: 'a' }, { name: 'c' }]);
  });
});

describe('poolsToContend', () => {
  it('contends for every allowed pool it does not lead when there is no limit', () => {
    expect(poolsToContend(choice({ leading: new Set(['b']) }))).toEqual(['a', 'c']);
  });

  it('never contends for a pool outside the allowed set', () => {
    expect(poolsToContend(choice({ allowed: ['b'] }))).toEqual(['b']);
  });

  it('below its limit, contends for all free allowed pools', () => {
    expect(poolsToContend(choice({ leading: new Set(['a']), limit: 2 }))).toEqual(['b', 'c']);
  });

  it('at its limit, contends for none', () => {
    expect(poolsToContend(choice({ leading: new Set(['a']), limit: 1 }))).toEqual([]);
    expect(poolsToContend(choice({ leading: new Set(['a', 'c']), limit: 2 }))).toEqual([]);
  });

  it('counts an attempt in flight against the limit, so two attempts cannot overshoot it', () => {
    expect(poolsToContend(choice({ trying: new Set(['a']), limit: 1 }))).toEqual([]);
    expect(poolsToContend(choice({ trying: new Set(['a']), limit: 2 }))).toEqual(['b', 'c']);
  });

  it('contends again once it loses one of its leases', () => {
    const full = choice({ leading: new Set(['a']), limit: 1 });
    expect(poolsToContend(full)).toEqual([]);
    expect(poolsToContend({ ...full, leading: new Set() })).toEqual(['a', 'b', 'c']);
  });

  it('contends for none while it leads more than its limit', () => {
    expect(poolsToContend(choice({ leading: new Set(['a', 'b']), limit: 1 }))).toEqual([]);
  });
});
