// The harness every other test relies on: a real redis-server, and processes that say when they are ready.
import { existsSync, readFileSync } from 'node:fs';
import { connect } from 'node:net';
import { dirname } from 'node:path';
import { keySpace } from '@sluice/protocol';
import { Redis } from 'ioredis';
import { describe, expect, it } from 'vitest';
import {
  metricSum,
  monitorRedis,
  startProcess,
  startRedis,
  startStack,
  tenantPoolYaml,
  untilLeads,
  untilReady,
  type Stack,
} from './index.ts';
import { markTestStart, tailsSince } from './process-log.ts';

/** One RESP round trip over a plain socket, so this test needs no Redis client. */
function ping(port: number): Promise<string> {
  return new Promise((resolve, reject) => {
    const socket = connect(port, '127.0.0.1', () => socket.write('PING\r\n'));
    socket.once('data', (data) => {
      socket.end();
      resolve(data.toString());
    });
    socket.once('error', reject);
  });
}

/** Dispatcher `first` holds `pool`'s lease and says it leads it; the second says it does not. */
async function expectFirstLeads(stack: Stack, pool: string) {
  const client = new Redis(stack.redis.url);
  expect(await client.get(keySpace().lease(pool))).toBe('first');
  await client.quit();
  const [first, second] = stack.dispatchers;
  expect(await metricSum(first!.url, 'sluice_leader', { pool })).toBe(1);
  expect(await metricSum(second!.url, 'sluice_leader', { pool })).toBe(0);
}

describe('test harness', () => {
  it('starts a real redis-server on a free port and stops it', async () => {
    const redis = await startRedis();
    expect(redis.url).toBe(`redis://127.0.0.1:${redis.port}`);
    expect(await ping(redis.port)).toBe('+PONG\r\n');
    await redis.stop();
    await expect(ping(redis.port)).rejects.toThrow(/ECONNREFUSED/);
  });

  it('gives two callers two separate servers', async () => {
    const [a, b] = await Promise.all([startRedis(), startRedis()]);
    expect(a.port).not.toBe(b.port);
    await Promise.all([a.stop(), b.stop()]);
  });

  it('rejects with the output of a process that exits before it is ready', async () => {
    await expect(
      startProcess({
        command: process.execPath,
        args: ['-e', 'console.log("booting"); process.exit(3)'],
        ready: /never/,
      }),
    ).rejects.toThrow(/exited \(3\)[\s\S]*booting/);
  });

  it('drains and drops what a process writes after its ready line when told to', async () => {
    // 4 MiB after the ready line, many times a pipe's buffer: a reader that stopped reading
    // would leave the child blocked in its write, and it would never exit.
    const child = await startProcess({
      command: process.execPath,
      args: [
        '-e',
        `console.log('ready'); const line = 'x'.repeat(1023) + '\\n';
         for (let i = 0; i < 4096; i++) process.stdout.write(line);
         process.stderr.write('done\\n');`,
      ],
      ready: /^ready$/,
      keepOutput: false,
    });
    expect(await child.closed).toEqual({ code: 0, signal: null });
    expect(child.output).toEqual(['ready']);
    expect(child.stderr).toEqual([]);
    await expect(child.waitForLine(/done/)).rejects.toThrow(/output is not kept/);
  });

  it('keeps for a failed test the last lines of the processes that ran during it, and no others', async () => {
    // One string per line: console.log colours a number argument where FORCE_COLOR is set.
    const start = (word: string) =>
      startProcess({
        command: process.execPath,
        args: [
          '-e',
          `console.log('ready'); for (let i = 0; i < 5; i++) console.log('${word} ' + i); setInterval(() => {}, 1000)`,
        ],
        ready: new RegExp(`^${word} 4$`),
        name: `the one ${word}`,
      });
    const before = await start('before');
    await before.stop();
    const since = markTestStart();
    const during = await start('during');
    await during.stop();
    const tails = tailsSince(since, 3);
    expect(tails).toBe(
      [
        `--- the one during (pid ${during.child.pid}, exited): last 3 of 6 lines ---`,
        'during 2',
        'during 3',
        'during 4',
      ].join('\n'),
    );
  });

  it('starts a whole stack that serves, and stops all of it', async () => {
    const stack = await startStack({ gateways: 2 });
    expect(stack.gateways).toHaveLength(2);
    expect(stack.gateway).toBe(stack.gateways[0]);
    expect(stack.env).toMatchObject({ REDIS_URL: stack.redis.url, VLLM_URL: stack.sim.url });
    const res = await fetch(`${stack.gateways[1]!.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({
        model: 'm',
        messages: [{ role: 'user', content: 'hi' }],
        max_tokens: 2,
      }),
    });
    expect(res.status).toBe(200);
    await stack.stop();
    await expect(ping(stack.redis.port)).rejects.toThrow(/ECONNREFUSED/);
    await expect(fetch(`${stack.gateway.url}/healthz`)).rejects.toThrow();
  });

  it('says so when a test reads a gateway it did not ask for', async () => {
    const stack = await startStack({ gateways: 0 });
    try {
      expect(() => stack.gateway).toThrow('startStack: no gateway was started');
      expect(stack.dispatcher.url).toMatch(/^http:/);
    } finally {
      await stack.stop();
    }
  });

  it('waits through a lease another dispatcher holds until the one named holds it', async () => {
    const redis = await startRedis();
    const client = new Redis(redis.url);
    const monitor = await monitorRedis(redis.url);
    try {
      const lease = keySpace('p').lease('alpha');
      await client.set(lease, 'other');
      let reads = 0;
      const twoReads = new Promise<void>((resolve) =>
        monitor.on('monitor', (_time: string, args: string[]) => {
          if (args[0] === 'get' && args[1] === lease && (reads += 1) === 2) resolve();
        }),
      );
      let led = false;
      const waiting = untilLeads(redis.url, 'first', { pool: 'alpha', prefix: 'p' }).then(() => {
        led = true;
      });
      // The second read is sent only once the first one's answer, 'other', was looked at; a
      // waiter that took 'other' for its leader has resolved by then.
      await Promise.race([twoReads, waiting]);
      expect(led).toBe(false);
      await client.set(lease, 'first');
      await waiting;
      expect(led).toBe(true);
    } finally {
      monitor.disconnect();
      await client.quit();
      await redis.stop();
    }
  });

  it('starts a leader and its standby: the next dispatcher only once the first holds the lease', async () => {
    const stack = await startStack({ dispatcherIds: ['first', 'second'], gateways: 0 });
    try {
      await expectFirstLeads(stack, 'default');
      const [first, second] = stack.dispatchers;
      // pino's epoch milliseconds: the first had the lease before the second printed a line.
      const time = (line: string) => (JSON.parse(line) as { time: number }).time;
      const acquired = first!.process.output.find((l) => l.includes('lease acquired'));
      expect(time(acquired!)).toBeLessThan(time(second!.process.output[0]!));
    } finally {
      await stack.stop();
    }
  });

  it('refuses a count of dispatchers and their ids together', async () => {
    await expect(startStack({ dispatchers: 2, dispatcherIds: ['first'] })).rejects.toThrow(
      'startStack: give dispatchers or dispatcherIds, not both',
    );
  });

  it("writes the config file every Sluice process reads, waits for its pool's lease, and removes it after them", async () => {
    const key = 'sk-alpha-harness-config-0123456789';
    const stack = await startStack({
      config: (sim) =>
        tenantPoolYaml({
          tenants: { alpha: key },
          engineUrl: sim.url,
          maxInflight: 1,
          queueDepth: 4,
        }),
      dispatcherIds: ['first', 'second'],
      leasePool: 'main',
    });
    const file = stack.env['SLUICE_CONFIG']!;
    try {
      expect(stack.env).not.toHaveProperty('VLLM_URL');
      expect(stack.env).not.toHaveProperty('VLLM_MODEL');
      expect(readFileSync(file, 'utf8')).toContain(`url: "${stack.sim.url}"`);
      // The lease waited for is the file's pool's: no `default` pool exists to lead.
      await expectFirstLeads(stack, 'main');
      // The gateway read the file too: its tenant's key is asked for, and served.
      await untilReady(stack.gateway);
      const ask = (headers: Record<string, string>) =>
        fetch(`${stack.gateway.url}/v1/chat/completions`, {
          method: 'POST',
          headers: { 'content-type': 'application/json', ...headers },
          body: JSON.stringify({
            model: 'm',
            messages: [{ role: 'user', content: 'hi' }],
            max_tokens: 2,
          }),
        });
      expect((await ask({})).status).toBe(401);
      expect((await ask({ authorization: `Bearer ${key}` })).status).toBe(200);
    } finally {
      await stack.stop();
    }
    expect(existsSync(dirname(file))).toBe(false);
  });

  it('removes the config file when a Sluice process refuses it at start-up', async () => {
    const failed = await startStack({ config: () => 'pools: [\n' }).then(
      () => new Error('startStack resolved'),
      (err: Error) => err,
    );
    // The dispatcher names the file it could not read.
    const file = /(\S*sluice-stack-[^/\s]+\/sluice\.yaml): not valid YAML/.exec(failed.message);
    expect(file, failed.message).not.toBeNull();
    expect(existsSync(dirname(file![1]!))).toBe(false);
  });

  it('refuses a lease pool without dispatcher ids', async () => {
    await expect(startStack({ leasePool: 'main' })).rejects.toThrow(
      'startStack: leasePool is for dispatcherIds',
    );
  });
});
