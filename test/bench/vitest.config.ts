// `npm run bench`: the benchmark scenarios, apart from `npm test` (test/vitest.config.ts only
// includes e2e/** and support/**). Scenarios run one at a time, since each one loads the
// machine; they measure and write bench/results/, and never assert a wall-clock number.
import { basename } from 'node:path';
import { fileURLToPath } from 'node:url';
import { defineConfig } from 'vitest/config';
import { BaseSequencer, type TestSpecification } from 'vitest/node';

/** The order; anything else after it, and the report, which reads every result, last. */
const ORDER = ['overhead', 'relay', 'parked', 'body', 'incident'];

class ScenarioOrder extends BaseSequencer {
  override async sort(files: TestSpecification[]): Promise<TestSpecification[]> {
    const rank = (file: TestSpecification) => {
      const name = basename(file.moduleId, '.bench.test.ts');
      if (name === 'report') return ORDER.length + 1;
      return ORDER.includes(name) ? ORDER.indexOf(name) : ORDER.length;
    };
    return [...files].sort((a, b) => rank(a) - rank(b));
  }
}

export default defineConfig({
  test: {
    root: fileURLToPath(new URL('../..', import.meta.url)),
    include: ['test/bench/*.bench.test.ts'],
    fileParallelism: false,
    sequence: { sequencer: ScenarioOrder },
    testTimeout: 180_000,
    hookTimeout: 60_000,
    // gc() for the body scenario's allocation figures; a young generation large enough that
    // one call on a 1 MiB body does not trigger a scavenge that would hide its garbage.
    execArgv: ['--expose-gc', '--min-semi-space-size=64', '--max-semi-space-size=64'],
    reporters: ['default'],
  },
});
