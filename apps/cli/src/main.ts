#!/usr/bin/env node
// The `sluice` command. Each subcommand lives in its own module and is loaded on demand,
// so `sluice engine-sim` does not pay for what `sluice up` needs.

const usage = `Usage: sluice <command> [flags]

Commands:
  up           run a local stack: redis-server, the engine simulator, and Sluice
  engine-sim   run the vLLM engine simulator (sluice engine-sim --help)
  gateway      run one gateway replica            (not built yet: issue "The broker")
  dispatcher   run the dispatcher                 (not built yet: issue "The broker")
  status       print queue and engine state       (not built yet)
`;

async function main(argv: string[]): Promise<void> {
  const [command, ...rest] = argv;
  switch (command) {
    case 'engine-sim': {
      const { runEngineSim } = await import('@sluice/engine-sim');
      return runEngineSim(rest);
    }
    case 'up': {
      const { runUp } = await import('./up.js');
      return runUp(rest);
    }
    case 'gateway':
    case 'dispatcher':
    case 'status':
      process.stderr.write(
        `sluice ${command}: not built yet; this workspace so far has the engine simulator (see README)\n`,
      );
      process.exitCode = 2;
      return;
    case undefined:
    case '--help':
    case '-h':
    case 'help':
      process.stdout.write(usage);
      return;
    default:
      process.stderr.write(`sluice: unknown command ${JSON.stringify(command)}\n\n${usage}`);
      process.exitCode = 2;
  }
}

main(process.argv.slice(2)).catch((err: unknown) => {
  process.stderr.write(`sluice: ${err instanceof Error ? err.message : String(err)}\n`);
  process.exitCode = 1;
});
