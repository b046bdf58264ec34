// A real redis-server on a free loopback port, with no persistence; stopped by the caller.
import { startProcess, type StartedProcess } from './process.ts';
import { freePort } from './ports.ts';

export interface TestRedis {
  readonly url: string;
  readonly port: number;
  readonly process: StartedProcess;
  stop(): Promise<void>;
}

export async function startRedis(): Promise<TestRedis> {
  const command = process.env['REDIS_SERVER_BIN'] ?? 'redis-server';
  for (let attempt = 1; ; attempt += 1) {
    const port = await freePort();
    try {
      const proc = await startProcess({
        command,
        args: ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'],
        ready: /Ready to accept connections/,
      });
      return { url: `redis://127.0.0.1:${port}`, port, process: proc, stop: () => proc.stop() };
    } catch (err) {
      // Another process may take the port between freePort() and bind; try a new one.
      if (attempt >= 3) throw err;
    }
  }
}
