import type { Exposition } from './types.js';

/**
 * The value of the first sample called `name` whose labels include every pair in
 * `match` (other labels are ignored), or `undefined` when there is none.
 */
export function sampleValue(
  exposition: Exposition,
  name: string,
  match?: Readonly<Record<string, string>>,
): number | undefined {
  const keys = match === undefined ? [] : Object.keys(match);
  search: for (const sample of exposition.samples) {
    if (sample.name !== name) continue;
    for (const key of keys) {
      if (!Object.hasOwn(sample.labels, key) || sample.labels[key] !== match?.[key])
        continue search;
    }
    return sample.value;
  }
  return undefined;
}
