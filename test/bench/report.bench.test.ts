// Runs after the scenarios (vitest runs small, quick files last): turns every
// bench/results/<scenario>.json into report.md, summary.md and the SVG charts.
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { writeReport } from './report.ts';
import { resultsDir } from './results.ts';

describe('the report', () => {
  it('writes bench/results/report.md, summary.md and a chart per series group', () => {
    const written = writeReport();
    console.log(`report: ${written.length} files in ${resultsDir}`);
    expect(existsSync(join(resultsDir, 'report.md'))).toBe(true);
    expect(existsSync(join(resultsDir, 'summary.md'))).toBe(true);
  });
});
