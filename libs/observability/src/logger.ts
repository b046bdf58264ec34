// pino options shared by every process (through Fastify's logger).

/**
 * Removed from every log object, whatever the level: credentials (a client's key, an
 * engine's or backend's key, cookies) and bodies (prompts and completions). Code must not
 * log these in the first place; this is the net under that rule. pino paths are exact, so
 * each place such a value can sit is listed.
 */
export const REDACTED_PATHS = [
  'req.headers.authorization',
  'req.headers["proxy-authorization"]',
  'req.headers.cookie',
  'headers.authorization',
  'headers["proxy-authorization"]',
  'authorization',
  'apiKey',
  '*.apiKey',
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
  };
}
