import { describe, expect, it } from 'vitest';
import { newJobId } from '../src/job-id.ts';

describe('job ids', () => {
  it('are UUIDv7-shaped and carry the millisecond they were made', () => {
    const id = newJobId(Date.UTC(2026, 10, 30));
    expect(id).toMatch(/^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
    expect(parseInt(id.slice(0, 8) + id.slice(9, 13), 16)).toBe(Date.UTC(2026, 10, 30));
  });

  it('sort in the order they were made, within a millisecond and when the clock steps back', () => {
    const base = Date.UTC(2026, 10, 30, 12);
    const times = [base, base, base, base + 1, base + 1, base - 5, base + 2];
    for (let i = 0; i < 5000; i += 1) times.push(base + 3);
    const ids = times.map((t) => newJobId(t));
    expect([...ids].sort()).toEqual(ids);
    expect(new Set(ids).size).toBe(ids.length);
  });
});
