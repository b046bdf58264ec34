// The one line a command that cannot go on prints before it exits.

interface ListenError {
  syscall?: string;
  address?: string;
  port?: number;
  message: string;
}

/**
 * `sluice <command>: <why>`. A listen error names the address and the reason without Node's
 * prefix: `sluice gateway: cannot listen on 127.0.0.1:8080: address already in use`.
 */
export function fatalLine(command: string | undefined, err: unknown): string {
  const who = command ? `sluice ${command}` : 'sluice';
  if (!(err instanceof Error)) return `${who}: ${String(err)}`;
  const e = err as Error & ListenError;
  if (e.syscall === 'listen' && e.address !== undefined) {
    const host = e.address.includes(':') ? `[${e.address}]` : e.address;
    const where = e.port === undefined ? e.address : `${host}:${e.port}`;
    // Node says `listen EADDRINUSE: address already in use 127.0.0.1:8080`.
    const reason = e.message
      .replace(/^listen \w+: /, '')
      .replace(` ${e.address}${e.port === undefined ? '' : `:${e.port}`}`, '');
    return `${who}: cannot listen on ${where}: ${reason}`;
  }
  return `${who}: ${e.message}`;
}
