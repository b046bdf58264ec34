// pino options shared by every process (through Fastify's logger).
export function loggerOptions(level: string, component: string) {
  return {
    level,
    base: { component, pid: process.pid },
    // Bodies are prompts: never log them, nor credentials.
    redact: { paths: ['req.headers.authorization', 'body', 'payload.body'], remove: true },
  };
}
