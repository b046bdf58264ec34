// The set-up file of every test project (vitest.shared.ts): a failed test prints the last
// lines of each process the harness ran during it (process-log.ts).
import { beforeEach } from 'vitest';
import { markTestStart, tailsSince } from './process-log.ts';

beforeEach(({ onTestFailed }) => {
  const since = markTestStart();
  onTestFailed(() => {
    const tails = tailsSince(since);
    if (tails) console.error(`The last lines of the processes this test ran:\n${tails}`);
  });
});
