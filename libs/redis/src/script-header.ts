// Where one of BullMQ's scripts takes its keys, read from the header BullMQ writes at the top
// of each (`KEYS[1] wait key`, ...). Sluice's additions to those scripts (take-count.ts,
// marker-rearm.ts) address keys by these indexes, so an update of BullMQ that renumbers them
// is followed, and one that stops naming a key stops the dispatcher at start-up, naming it,
// rather than letting it read the wrong key.

/**
 * The 1-based KEYS index of each key in `names`, as `script`'s header gives it. Throws naming
 * the first key the header no longer documents.
 */
export function headerKeys<Name extends string>(
  bullLua: string,
  names: readonly Name[],
  script: string,
): Record<Name, number> {
  const found = {} as Record<Name, number>;
  for (const name of names) {
    const match = new RegExp(`KEYS\\[(\\d+)\\]\\s+${name}\\b`).exec(bullLua);
    if (!match) throw new Error(`BullMQ's ${script} no longer names its ${name} (KEYS[n])`);
    found[name] = Number(match[1]);
  }
  return found;
}
