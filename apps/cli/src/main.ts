#!/usr/bin/env node
// The `sluice` command. Each subcommand lives in its own module and is loaded on demand,
// so `sluice engine-sim` does not pay for what `sluice up` needs. Every command parses its
// flags strictly; a command line it does not accept is one line on stderr and exit 2.
import { readFileSync } from 'node:fs';
import { strictFlags, UsageError } from './args.js';
import { fatalLine } from './fatal.js';

const usage = `Usage: sluice <command> [flags]

Commands:
  up           run a local stack: redis-server, the engine simulator, and Sluice
  engine-sim   run the vLLM engine simulator (sluice engine-sim --help)
  gateway      run one gateway replica (configured by the environment; sluice gateway --help)
  dispatcher   run a dispatcher: leads or stands by for every pool (sluice dispatcher --help)
  status       print each pool's queue, in-flight/cap, gate and engine gauges (--json)
  version      print the version (also --version, -v)
`;

function version(): string {
  const root = new URL('../../../package.json', import.meta.url);
  return (JSON.parse(readFileSync(root, 'utf8')) as { version: string }).version;
}

/** gateway and dispatcher take no arguments; true when they should start. */
async function service(command: 'gateway' | 'dispatcher', argv: string[]): Promise<boolean> {
  if (!strictFlags(command, argv, {}).help) return true;
  const { serviceHelp } = await import('./help.js');
  process.stdout.write(serviceHelp(command));
  return false;
}

async function main(command: string | undefined, rest: string[]): Promise<void> {
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
      if (!(await service(command, rest))) return;
      const { runGateway } = await import('@sluice/gateway');
      return runGateway();
    }
    case 'dispatcher': {
      if (!(await service(command, rest))) return;
      const { runDispatcher } = await import('@sluice/dispatcher');
      return runDispatcher();
    }
    case 'status': {
      const { runStatus } = await import('./status.js');
      return runStatus(rest);
    }
    case 'version':
    case '--version':
    case '-v':
      if (rest.length > 0)
        throw new UsageError(`sluice ${command}: unexpected argument ${JSON.stringify(rest[0])}`);
      process.stdout.write(`sluice ${version()}\n`);
      return;
    case undefined:
    case '--help':
    case '-h':
    case 'help':
      process.stdout.write(usage);
      return;
    default:
      throw new UsageError(
        `sluice: unknown command ${JSON.stringify(command)}\n\n${usage.trimEnd()}`,
      );
  }
}

const [command, ...rest] = process.argv.slice(2);
main(command, rest).catch((err: unknown) => {
  if (err instanceof UsageError) {
    process.stderr.write(`${err.message}\n`);
    process.exitCode = 2;
    return;
  }
  // A command's own parseArgs (status, pool) refused its command line.
  const code = err instanceof Error ? (err as NodeJS.ErrnoException).code : undefined;
  if (code?.startsWith('ERR_PARSE_ARGS_')) {
    process.stderr.write(`sluice ${command}: ${(err as Error).message}\n`);
    process.exitCode = 2;
    return;
  }
  process.stderr.write(`${fatalLine(command, err)}\n`);
  // A failed start may leave a Redis client reconnecting or a timer armed: none of it may keep
  // the process alive (a supervisor restarts what exits, not what hangs).
  process.exit(1);
});
