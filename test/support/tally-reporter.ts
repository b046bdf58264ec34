// Appends each project's counts to SLUICE_TEST_TALLY so `.ci/run` can print one
// "N passed, N failed" line for the whole workspace after Nx ran every project.
import { appendFileSync } from 'node:fs';
import type { Reporter, TestModule } from 'vitest/node';

export default class TallyReporter implements Reporter {
  onTestRunEnd(testModules: ReadonlyArray<TestModule>): void {
    const file = process.env['SLUICE_TEST_TALLY'];
    if (!file) return;
    let passed = 0;
    let failed = 0;
    let skipped = 0;
    for (const mod of testModules) {
      if (mod.state() === 'failed' && [...mod.children.allTests()].length === 0) failed += 1;
      for (const test of mod.children.allTests()) {
        const state = test.result().state;
        if (state === 'passed') passed += 1;
        else if (state === 'failed') failed += 1;
        else skipped += 1;
      }
    }
    appendFileSync(file, `${passed} ${failed} ${skipped}\n`);
  }
}
