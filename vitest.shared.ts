// The one vitest setup every project uses; each project's vitest.config.ts re-exports it.
import { fileURLToPath } from 'node:url';
import { defineConfig } from 'vitest/config';
import TallyReporter from './test/support/tally-reporter.ts';

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    // Tests start real processes (redis-server, the simulator, Sluice); a generous
    // ceiling keeps a wedged process from hanging CI without timing anything.
    testTimeout: 60_000,
    hookTimeout: 60_000,
    reporters: ['default', new TallyReporter()],
    // A failed test prints what the processes it ran wrote last (test/support/process-log.ts).
    setupFiles: [fileURLToPath(new URL('./test/support/print-on-failure.ts', import.meta.url))],
  },
});
