// A gateway replica drained by SIGTERM in a rolling update, as clients behind a Service see
// it. A Service balances per connection: a pooled client whose kept-alive socket stays on the
// draining replica would send every retry back to it, so from the drain's start the replica
// closes idle connections and answers with `Connection: close`. Pass-through requests are
// drained as held ones are: served to their end within the drain period, and what is still
// running at its end is ended by the gateway as `shutting_down` (in-band once a stream has
// begun), never cut and logged as the client's `cancelled`.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { once } from 'node:events';
import { connect, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  answer,
  eventually,
  readAll,
  startDispatcher,
  startEngineSim,
  startGateway,
  startRedis,
  type SluiceProcess,
  type TestEngineSim,
  type TestRedis,
  untilReady,
} from '../support/index.ts';

let redis: TestRedis;
let engine: TestEngineSim;
let backend: TestEngineSim;
let dispatcher: SluiceProcess;
let dir: string;
let env: Record<string, string>;

beforeAll(async () => {
  redis = await startRedis();
  // Every scheduler step takes 0.1 s: a 40-token answer streams for 4 s at next to no CPU.
  const sim = ['--profile', 'instant', '--max-num-seqs', '64', '--step-overhead-seconds', '0.1'];
  [engine, backend] = await Promise.all([
    startEngineSim([...sim, '--model', 'm']),
    startEngineSim([...sim, '--model', 'p']),
  ]);
  dir = mkdtempSync(join(tmpdir(), 'sluice-drain-rolling-'));
  const config = join(dir, 'sluice.yaml');
  writeFileSync(
    config,
    [
      'pools:',
      '  - name: default',
      '    models: [m]',
      '    maxInflight: 4',
      '    engines:',
      `      - url: "${engine.url}"`,
      'passthrough:',
      `  - { model: p, url: "${backend.url}" }`,
      '',
    ].join('\n'),
  );
  env = { REDIS_URL: redis.url, SLUICE_CONFIG: config, SLUICE_DEGRADATION: 'off' };
  dispatcher = await startDispatcher(env);
}, 60_000);

afterAll(async () => {
  // A test that failed may leave an endless stream on the dispatcher, which SIGTERM would let
  // finish.
  await dispatcher?.stop('SIGKILL');
  await Promise.all([engine?.stop(), backend?.stop()]);
  await redis?.stop();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

function post(base: string, model: string, extra: Record<string, unknown>, id: string) {
  return fetch(`${base}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-request-id': id },
    body: JSON.stringify({ model, messages: [{ role: 'user', content: id }], ...extra }),
  });
}

/** The access log line of request `id`. */
function accessLine(gateway: SluiceProcess, id: string): Record<string, unknown> | undefined {
  return gateway.process.output
    .filter((line) => line.includes('"kind":"access"'))
    .map((line) => JSON.parse(line) as Record<string, unknown>)
    .find((line) => line['id'] === id);
}

async function open(base: string): Promise<Socket> {
  const url = new URL(base);
  const socket = connect(Number(url.port), url.hostname);
  await once(socket, 'connect');
  return socket;
}

type Exchange =
  { kind: 'response'; head: string; body: string; ended: Promise<void> } | { kind: 'closed' };

/**
 * Writes `request` on `socket` and reads one response (headers and a Content-Length body), or
 * learns that the server closed the connection instead. `ended` resolves when the server
 * ends the connection after the response.
 */
function exchange(socket: Socket, request: string): Promise<Exchange> {
  // Closed before this call: its 'close' event has been and gone.
  if (socket.destroyed) return Promise.resolve({ kind: 'closed' });
  return new Promise((resolve) => {
    let text = '';
    const ended = new Promise<void>((end) => socket.once('close', () => end()));
    const onData = (chunk: Buffer) => {
      text += chunk.toString('latin1');
      const split = text.indexOf('\r\n\r\n');
      if (split < 0) return;
      const head = text.slice(0, split);
      const length = Number(/\r\ncontent-length: *(\d+)/i.exec(head)?.[1] ?? 0);
      const body = text.slice(split + 4);
      if (body.length < length) return;
      socket.off('data', onData);
      socket.off('close', onClose);
      resolve({ kind: 'response', head: head.toLowerCase(), body, ended });
    };
    const onClose = () => resolve({ kind: 'closed' });
    socket.on('data', onData);
    socket.once('close', onClose);
    // A write to a connection the server closed fails; the close is what is asserted.
    socket.on('error', () => {});
    socket.write(request);
  });
}

const healthz = 'GET /healthz HTTP/1.1\r\nhost: sluice\r\n\r\n';

describe('gateway drain: connections', () => {
  it('closes idle kept-alive connections at once and answers every new request with Connection: close, cutting no request in progress', async () => {
    // A drain period far past the test: the endless stream keeps it going until a second signal.
    const gateway = await startGateway({ ...env, SLUICE_SHUTDOWN_DRAIN_SECONDS: '600' });
    try {
      await untilReady(gateway);
      const stream = await post(
        gateway.url,
        'm',
        { stream: true, max_tokens: 100_000, ignore_eos: true },
        'drain-held-stream',
      );
      expect(stream.status).toBe(200);
      const streamed = readAll(stream);

      // A pooled client's connection, idle between two requests.
      const idle = await open(gateway.url);
      const before = await exchange(idle, healthz);
      expect(before.kind).toBe('response');
      expect(before.kind === 'response' && before.head).toContain('connection: keep-alive');

      gateway.process.child.kill('SIGTERM');
      await gateway.process.waitForLine(/"msg":"gateway draining"/);

      // The next request on it cannot reach this replica: the connection is gone, and the
      // client's retry opens one that the Service balances afresh.
      expect(await exchange(idle, healthz)).toEqual({ kind: 'closed' });

      // A request on a new connection (one still routed here) gets the refusal, told to
      // reconnect, and the connection ends with it.
      const fresh = await open(gateway.url);
      const body = JSON.stringify({ model: 'm', messages: [{ role: 'user', content: 'late' }] });
      const refused = await exchange(
        fresh,
        'POST /v1/chat/completions HTTP/1.1\r\nhost: sluice\r\ncontent-type: application/json\r\n' +
          `content-length: ${Buffer.byteLength(body)}\r\n\r\n${body}`,
      );
      if (refused.kind !== 'response') throw new Error('the refusal did not arrive');
      expect(refused.head).toMatch(/^http\/1\.1 503/);
      expect(refused.head).toContain('x-sluice-reject-reason: shutting_down');
      expect(refused.head).toContain('connection: close');
      await refused.ended;

      // The stream in progress was not cut by any of it: it ends only when the drain is cut
      // short, with the gateway's in-band error.
      expect(gateway.process.output.join('\n')).not.toContain('"msg":"gateway drained"');
      gateway.process.child.kill('SIGTERM');
      expect(await streamed).toMatch(
        /data: \{"error":\{"message":"[^"]+","type":"server_error","param":null,"code":"shutting_down"\}\}\n\ndata: \[DONE\]\n\n$/,
      );
      expect((await gateway.process.closed).code).toBe(0);
    } finally {
      await gateway.stop('SIGKILL');
    }
  });
});

describe('gateway drain: pass-through requests', () => {
  it('serves a pass-through stream in progress to its end, then exits by itself', async () => {
    const gateway = await startGateway({ ...env, SLUICE_SHUTDOWN_DRAIN_SECONDS: '600' });
    try {
      await untilReady(gateway);
      const extra = { stream: true, max_tokens: 40, ignore_eos: true };
      const res = await post(gateway.url, 'p', extra, 'drain-pt-whole');
      expect(res.status).toBe(200);
      const text = readAll(res);

      gateway.process.child.kill('SIGTERM');
      const [draining] = await gateway.process.waitForLine(/^.*"gateway draining".*$/);

      const body = await text;
      expect(body).not.toContain('transport error');
      expect(body).not.toContain('"error"');
      expect(body.endsWith('data: [DONE]\n\n')).toBe(true);
      // As many events as the backend sends the same request without Sluice in between.
      const direct = await readAll(await post(backend.url, 'p', extra, 'drain-pt-whole'));
      expect(body.match(/^data: \{/gm)?.length).toBe(direct.match(/^data: \{/gm)?.length);
      expect(draining).toContain('"passthrough":1');
      expect((await gateway.process.closed).code).toBe(0);
      expect(accessLine(gateway, 'drain-pt-whole')).toMatchObject({
        passthrough: true,
        status: 200,
      });
      expect(gateway.process.output.join('\n')).not.toContain('drain period over');
    } finally {
      await gateway.stop('SIGKILL');
    }
  });

  it('at the end of the drain period ends pass-through requests as shutting_down: 503 before the head, in-band in a stream', async () => {
    const gateway = await startGateway({ ...env, SLUICE_SHUTDOWN_DRAIN_SECONDS: '1' });
    try {
      await untilReady(gateway);
      await eventually(
        async () => ((await backend.state()).running === 0 ? true : undefined),
        'an idle pass-through backend',
      );
      const endless = { max_tokens: 100_000, ignore_eos: true };
      const stream = await post(gateway.url, 'p', { ...endless, stream: true }, 'drain-pt-stream');
      expect(stream.status).toBe(200);
      const streamed = readAll(stream);
      // A plain answer comes whole at its end: its head is not sent while it runs.
      const plain = answer(post(gateway.url, 'p', endless, 'drain-pt-plain'));
      await eventually(
        async () => ((await backend.state()).running === 2 ? true : undefined),
        'both pass-through requests on the backend',
      );

      gateway.process.child.kill('SIGTERM');

      expect(await streamed).toMatch(
        /\n\ndata: \{"error":\{"message":"[^"]+","type":"server_error","param":null,"code":"shutting_down"\}\}\n\ndata: \[DONE\]\n\n$/,
      );
      const refused = await plain;
      expect(refused).toMatchObject({ status: 503, reason: 'shutting_down' });
      expect(Number(refused.retryAfter)).toBeGreaterThanOrEqual(1);
      expect((JSON.parse(refused.body) as { error: { code: string } }).error.code).toBe(
        'shutting_down',
      );

      expect((await gateway.process.closed).code).toBe(0);
      for (const id of ['drain-pt-stream', 'drain-pt-plain'])
        expect(accessLine(gateway, id)).toMatchObject({
          passthrough: true,
          status: 503,
          reason: 'shutting_down',
        });
      expect(gateway.process.output.join('\n')).toMatch(/"passthroughCut":2.*"drain period over/);
      // The backend's work stopped with them.
      await eventually(
        async () => ((await backend.state()).running === 0 ? true : undefined),
        'the backend to drop both requests',
      );
    } finally {
      await gateway.stop('SIGKILL');
    }
  });
});
