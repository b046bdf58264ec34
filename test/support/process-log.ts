// What the processes a test ran wrote, shown when the test fails. A flake on a loaded CI
// machine is seldom reproduced at a desk: the gateway's and dispatcher's own lines (a job
// discarded, a subscriber recycled, a lease lost) are what tells its cause, and they are gone
// with the processes once the run ends. So every process the harness starts is logged here,
// and the set-up file print-on-failure.ts prints the last lines of each one that was running
// during a failed test.
//
// "During" is told by an order of events (exits, tests begun), not by clock readings.

export interface LoggedProcess {
  /** How the failure output names it: `sluice gateway`, `redis-server`, … */
  readonly name: string;
  readonly pid: number | undefined;
  /** Every line kept so far (empty when its output is not kept). */
  readonly output: readonly string[];
}

interface Entry {
  process: LoggedProcess;
  /** When it exited, in the order of events; undefined while it runs. */
  exitedAt: number | undefined;
}

/** Lines shown per process, and the longest line shown whole. */
export const FAILURE_TAIL_LINES = 60;
const LONGEST_LINE = 600;

let clock = 0;
const entries: Entry[] = [];

/** Logs a started process; returns what to call when it has exited. */
export function logProcess(process: LoggedProcess): () => void {
  const entry: Entry = { process, exitedAt: undefined };
  entries.push(entry);
  return () => {
    entry.exitedAt = clock += 1;
  };
}

/** A point in the order of events: a test's beginning. */
export function markTestStart(): number {
  // Processes that exited before this point are no test's from here on.
  for (let i = entries.length - 1; i >= 0; i -= 1)
    if (entries[i]!.exitedAt !== undefined) entries.splice(i, 1);
  return (clock += 1);
}

/**
 * The last lines of every process that ran after `since` (a `markTestStart`), each under a
 * header naming it; empty when none kept any output.
 */
export function tailsSince(since: number, lines = FAILURE_TAIL_LINES): string {
  const parts: string[] = [];
  for (const { process, exitedAt } of entries) {
    if ((exitedAt !== undefined && exitedAt < since) || process.output.length === 0) continue;
    const shown = process.output.slice(-lines);
    const state = exitedAt === undefined ? 'running' : 'exited';
    parts.push(
      `--- ${process.name} (pid ${process.pid ?? '?'}, ${state}): last ${shown.length} of ${process.output.length} lines ---`,
      ...shown.map((l) => (l.length > LONGEST_LINE ? `${l.slice(0, LONGEST_LINE)}…` : l)),
    );
  }
  return parts.join('\n');
}
