// pino options shared by every process (through Fastify's logger).
import { stdoutPerTurn } from './log-stream.js';

/**
 * Removed from every log object, whatever the level: credentials (a client's key, an
 * engine's or backend's key, a tenant's keys, Redis passwords, cookies) and bodies (prompts
 * and completions). Code must not log these in the first place; this is the net under that
 * rule. pino paths are exact, so each place such a value can sit is listed.
 *
 * No path starts with a wildcard: pino runs a first-segment wildcard's redactor on every
 * top-level field of every line (lib/tools.js `_asJson`, `wildcardFirstSym`), and
 * @pinojs/redact parses its paths again on each call, which made redaction about a quarter of
 * an access-log line's cost. A path starting with a name costs nothing on lines without that
 * field. So `*.apiKey` became the objects that carry one: an engine, a backend, and the lists
 * of them.
 */
export const REDACTED_PATHS = [
  'req.headers.authorization',
  'req.headers["proxy-authorization"]',
  'req.headers.cookie',
  'headers.authorization',
  'headers["proxy-authorization"]',
  'headers.cookie',
  'authorization',
  'apiKey',
  'apiKeys',
  'password',
  'sentinelPassword',
  'engine.apiKey',
  'engines[*].apiKey',
  'backend.apiKey',
  'backends[*].apiKey',
  'tenant.apiKeys',
  'tenants[*].apiKeys',
  'redis.password',
  'redis.sentinelPassword',
  'body',
  'payload.body',
  'payload.bodyBase64',
  'job.data.body',
  'job.data.bodyBase64',
];

export function loggerOptions(level: string, component: string) {
  return {
    level,
    base: { component, pid: process.pid },
    redact: { paths: REDACTED_PATHS, remove: true },
    stream: stdoutPerTurn(),
  };
}
