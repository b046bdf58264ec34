// Strict flags for every command: node:util.parseArgs, and a refusal that is one line naming
// what was wrong (exit 2), not parseArgs's advice on positional arguments.
import { parseArgs, type ParseArgsConfig } from 'node:util';

/** A command line the command does not accept: `sluice` prints the message and exits 2. */
export class UsageError extends Error {}

type Options = NonNullable<ParseArgsConfig['options']>;
type Values = Record<string, string | boolean | (string | boolean)[] | undefined>;

function quoted(message: string): string {
  return /'([^']*)'/.exec(message)?.[1] ?? '';
}

/** Parses `argv` with `--help`/`-h` added; anything else unknown throws a UsageError. */
export function strictFlags(command: string, argv: string[], options: Options): Values {
  try {
    return parseArgs({
      args: argv,
      options: { ...options, help: { type: 'boolean', short: 'h' } },
      strict: true,
      allowPositionals: false,
    }).values;
  } catch (err) {
    const e = err as { code?: string; message: string };
    const why =
      e.code === 'ERR_PARSE_ARGS_UNKNOWN_OPTION'
        ? `unknown flag ${quoted(e.message)}`
        : e.code === 'ERR_PARSE_ARGS_UNEXPECTED_POSITIONAL'
          ? `unexpected argument ${JSON.stringify(quoted(e.message))}`
          : e.message;
    throw new UsageError(`sluice ${command}: ${why} (see sluice ${command} --help)`);
  }
}
