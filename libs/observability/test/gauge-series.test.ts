// A gauge series set by its change reads, after every write, exactly what a plain `set` would
// have left: whole numbers by `inc`, fractions by `set`, repeats by nothing.
import fc from 'fast-check';
import { Gauge, Registry } from 'prom-client';
import { describe, expect, it } from 'vitest';
import { gaugeSeries } from '../src/gauge-series.ts';

function gauge() {
  const registry = new Registry();
  const g = new Gauge({
    name: 'g',
    help: 'h',
    labelNames: ['pool', 'engine'],
    registers: [registry],
  });
  const read = async (labels: Record<string, string>) =>
    (await g.get()).values.find(
      (v) => v.labels.pool === labels.pool && v.labels.engine === labels.engine,
    )?.value;
  return { g, read };
}

describe('gaugeSeries', () => {
  it('reads what was set last, by whole steps, fractions and repeats', async () => {
    const { g, read } = gauge();
    const labels = { pool: 'p', engine: 'e' };
    const series = gaugeSeries(g, labels);
    for (const value of [3, 5, 5, 0, 2.5, 2.5, 7, -1, 4]) {
      series.set(value);
      expect(await read(labels)).toBe(value);
    }
  });

  it('writes only its own series of the gauge', async () => {
    const { g, read } = gauge();
    const a = gaugeSeries(g, { pool: 'p', engine: 'a' });
    const b = gaugeSeries(g, { engine: 'b', pool: 'p' });
    a.set(2);
    b.set(9);
    a.set(4);
    expect(await read({ pool: 'p', engine: 'a' })).toBe(4);
    expect(await read({ pool: 'p', engine: 'b' })).toBe(9);
    expect((await g.get()).values).toHaveLength(2);
  });

  it('matches a plain set after any sequence of writes', async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.array(
          fc.oneof(
            fc.integer({ min: -1000, max: 1000 }),
            fc.double({ noNaN: true, min: -1e6, max: 1e6 }).map((v) => v + 0),
          ),
          { minLength: 1, maxLength: 40 },
        ),
        async (values) => {
          const { g, read } = gauge();
          const labels = { pool: 'p', engine: 'e' };
          const series = gaugeSeries(g, labels);
          for (const value of values) series.set(value);
          expect(await read(labels)).toBe(values.at(-1));
        },
      ),
    );
  });
});
