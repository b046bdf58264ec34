// One series of a labelled gauge that the hot path writes often (once or twice per request).
//
// prom-client's `Gauge.set` hashes the labels anew on every call (`Object.keys`, a sort, and a
// new entry object: lib/util.js `setValue`), about 6 KB of garbage per request in the
// dispatcher, where a young-generation collection is the usual cause of a slow request
// (docs/performance.md). `Gauge.inc` hashes by the gauge's sorted label names and adds to the
// entry in place. A series that has one writer can therefore be set by its change: nothing
// when the value is the same, an `inc` by the difference between whole numbers, a `set`
// otherwise (differences of fractions would drift).
import type { Gauge } from 'prom-client';

export interface GaugeSeries {
  set(value: number): void;
}

export function gaugeSeries<L extends string>(
  gauge: Gauge<L>,
  labels: Partial<Record<L, string | number>>,
): GaugeSeries {
  let last: number | undefined;
  return {
    set(value) {
      if (value === last) return;
      if (last !== undefined && Number.isInteger(value) && Number.isInteger(last))
        gauge.inc(labels, value - last);
      else gauge.set(labels, value);
      last = value;
    },
  };
}
