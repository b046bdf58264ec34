// A writable stream that parses what a logger writes into it, one JSON object per line, for
// tests that give a real pino (or Fastify's logger) a destination they can read.
import { Writable } from 'node:stream';

export function jsonLines(): { stream: Writable; lines: Record<string, unknown>[] } {
  const lines: Record<string, unknown>[] = [];
  const stream = new Writable({
    write(chunk: Buffer, _encoding, done) {
      for (const line of chunk.toString().split('\n').filter(Boolean))
        lines.push(JSON.parse(line) as Record<string, unknown>);
      done();
    },
  });
  return { stream, lines };
}
