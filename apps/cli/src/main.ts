#!/usr/bin/env node
// The `sluice` command. Each subcommand lives in its own module and is loaded on demand,
// so `sluice engine-sim` does not pay for what `sluice up` needs.

const usage = `Usage: sluice <command> [flags]

Commands:
  up           run a local stack: redis-server, the engine simulator, and Sluice
  engine-sim   run the vLLM engine simulator (sluice engine-sim --help)
  gateway      run one gateway replica (configured by the environment; see README)
  dispatcher   run a dispatcher: leads or stands by for every pool
  status       print each pool's queue, in-flight/cap, gate and engine gauges (--json)
  pool         pause, resume or drain a pool (sluice pool --help)
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
    case 'gateway': {
      const { runGateway } = await import('@sluice/gateway');
      return runGateway();
    }
    case 'dispatcher': {
      const { runDispatcher } = await import('@sluice/dispatcher');
      return runDispatcher();
    }
    case 'status': {
      const { runStatus } = await import('./status.js');
      return runStatus(rest);
    }
    case 'pool': {
      const { runPool } = await import('./pool.js');
      return runPool(rest);
    }
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
