// `sluice engine-sim`: parse flags, start, stop cleanly on SIGINT/SIGTERM.
import { parseSimOptions, SimConfigError, simHelp } from './options.js';
import { createEngineSim } from './server.js';

export async function runEngineSim(argv: readonly string[]): Promise<void> {
  if (argv.includes('--help') || argv.includes('-h')) {
    process.stdout.write(`${simHelp()}\n`);
    return;
  }
  let options;
  try {
    options = parseSimOptions(argv);
  } catch (err) {
    if (err instanceof SimConfigError) {
      process.stderr.write(`sluice engine-sim: ${err.message}\n`);
      process.exitCode = 2;
      return;
    }
    throw err;
  }
  const sim = createEngineSim(options);
  await sim.listen();
  const stop = () => {
    void sim.close().then(() => process.exit(0));
  };
  process.once('SIGINT', stop);
  process.once('SIGTERM', stop);
}
