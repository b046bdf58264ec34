// The CA Sluice trusts for Redis TLS (REDIS_TLS_CA_FILE), read once per process: every
// connection, and every reconnect, uses the same bytes, and a missing file fails at start.
import { readFileSync } from 'node:fs';

/** REDIS_TLS_CA_FILE could not be read: a start-up error, said with the path and the cause. */
export class RedisTlsError extends Error {
  readonly code = 'ERR_SLUICE_REDIS_TLS';
}

const cache = new Map<string, Buffer>();

export function readCa(path: string): Buffer {
  let ca = cache.get(path);
  if (ca === undefined) {
    try {
      ca = readFileSync(path);
    } catch (err) {
      const detail = err instanceof Error ? err.message : String(err);
      throw new RedisTlsError(
        `REDIS_TLS_CA_FILE=${JSON.stringify(path)} cannot be read: ${detail}`,
      );
    }
    cache.set(path, ca);
  }
  return ca;
}
