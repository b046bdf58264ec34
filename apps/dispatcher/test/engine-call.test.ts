// The engine call against the real engine simulator (its faults switched on at run time): what
// reaches the relay, in which order, and the outcome, for an answer, a 500, a 400, a stream cut off
// mid-body, an engine nobody listens on, one that has the request and sends no head in time,
// a stream whose prefill outlasts the body time-out (or the headers time-out), one that stops
// between chunks, and a cancel before and during the call. The relay here records its calls;
// its own frames and Redis are pinned in relay.test.ts.
import type { EngineConfig } from '@sluice/config';
import { dispatcherMetrics, Registry } from '@sluice/observability';
import type { EndInfo, ErrorInfo, HeadInfo } from '@sluice/protocol';
import { eventually, freePort, startEngineSim, type TestEngineSim } from '@sluice/test/support';
import { once } from 'node:events';
import { createServer, type IncomingHttpHeaders } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { Cancellation, CancelledError } from '../src/cancels.ts';
import { callOutcomes, EngineClient } from '../src/engine-call.ts';
import type { ReplyRelay } from '../src/relay.ts';

let sim: TestEngineSim;
const clients: EngineClient[] = [];

beforeAll(async () => {
  sim = await startEngineSim(['--profile', 'instant', '--model', 'm']);
});
afterEach(async () => {
  await sim.setFaults({ errorRate: 0, dropStreamAfterTokens: null });
  await Promise.all(clients.splice(0).map((c) => c.close()));
});
afterAll(() => sim?.stop());

type Call =
  | { kind: 'head'; info: HeadInfo }
  | { kind: 'data'; text: string }
  | { kind: 'end'; info: EndInfo | undefined }
  | { kind: 'error'; info: ErrorInfo };

/** A relay that keeps what it was given, in order. */
function recordingRelay() {
  const calls: Call[] = [];
  const relay = {
    head: (info: HeadInfo) => calls.push({ kind: 'head', info }),
    data: (chunk: Buffer) => calls.push({ kind: 'data', text: chunk.toString() }),
    end: (info?: EndInfo) => calls.push({ kind: 'end', info }),
    error: (info: ErrorInfo) => calls.push({ kind: 'error', info }),
  };
  return { relay: relay as unknown as ReplyRelay, calls };
}

function client(
  url = sim.url,
  headersTimeoutMs = 10_000,
  apiKey?: string,
  bodyTimeoutMs = 10_000,
): EngineClient {
  const config: EngineConfig = {
    name: 'e',
    url,
    maxInflight: 4,
    capSource: 'config',
    lane: 'any',
    ...(apiKey === undefined ? {} : { apiKey }),
  };
  const c = new EngineClient(config, { headersTimeoutMs, bodyTimeoutMs });
  clients.push(c);
  return c;
}

const body = (stream: boolean, maxTokens = 6) =>
  JSON.stringify({
    model: 'm',
    messages: [{ role: 'user', content: 'hello' }],
    max_tokens: maxTokens,
    stream,
  });

describe('engine call', () => {
  it('relays the head, every chunk in order and the end; watches the first byte once', async () => {
    const { relay, calls } = recordingRelay();
    let firstBytes = 0;
    const seen: string[] = [];
    const outcome = await client().call(
      '/v1/chat/completions',
      body(true),
      relay,
      new Cancellation(),
      {
        firstByte: () => (firstBytes += 1),
        data: (chunk) => seen.push(chunk.toString()),
        end: () => ({ completionTokens: 6 }),
      },
    );
    expect(outcome).toBe('ok');
    expect(firstBytes).toBe(1);
    expect(calls[0]).toEqual({
      kind: 'head',
      info: { status: 200, contentType: expect.stringContaining('text/event-stream') },
    });
    expect(calls.at(-1)).toEqual({ kind: 'end', info: { completionTokens: 6 } });
    const data = calls.filter((c) => c.kind === 'data').map((c) => c.text);
    expect(data).toEqual(seen);
    const text = data.join('');
    expect(text.startsWith('data: ')).toBe(true);
    expect(text.endsWith('data: [DONE]\n\n')).toBe(true);
  });

  it("relays an engine's 500 as its answer, and calls the outcome engine_error", async () => {
    await sim.setFaults({ errorRate: 1 });
    const { relay, calls } = recordingRelay();
    const outcome = await client().call(
      '/v1/chat/completions',
      body(false),
      relay,
      new Cancellation(),
    );
    expect(outcome).toBe('engine_error');
    expect(calls[0]).toMatchObject({ kind: 'head', info: { status: 500 } });
    expect(calls.at(-1)).toMatchObject({ kind: 'end' });
    expect(calls.some((c) => c.kind === 'error')).toBe(false);
  });

  it("relays an engine's 400 as its answer, calls the outcome client_error, and shows the first byte's status", async () => {
    const { relay, calls } = recordingRelay();
    const statuses: number[] = [];
    // A prompt over max_model_len: vLLM refuses it at once, before any prefill.
    const tooLong = JSON.stringify({ ...JSON.parse(body(true)), sim_prompt_tokens: 1_000_000 });
    const outcome = await client().call(
      '/v1/chat/completions',
      tooLong,
      relay,
      new Cancellation(),
      {
        firstByte: (status) => statuses.push(status),
      },
    );
    expect(outcome).toBe('client_error');
    expect(statuses).toEqual([400]);
    expect(calls[0]).toMatchObject({ kind: 'head', info: { status: 400 } });
    expect(calls.at(-1)).toMatchObject({ kind: 'end' });
  });

  it("names every outcome in sluice_completed_total's HELP", async () => {
    const registry = new Registry();
    dispatcherMetrics(registry);
    const help = (await registry.getSingleMetric('sluice_completed_total')!.get()).help;
    for (const outcome of callOutcomes) expect(help).toMatch(new RegExp(`\\b${outcome}\\b`));
  });

  it('ends a stream the engine cut off mid-body with an engine_error frame', async () => {
    await sim.setFaults({ dropStreamAfterTokens: 2 });
    const { relay, calls } = recordingRelay();
    const outcome = await client().call(
      '/v1/chat/completions',
      body(true, 20),
      relay,
      new Cancellation(),
    );
    expect(outcome).toBe('engine_error');
    expect(calls[0]).toMatchObject({ kind: 'head', info: { status: 200 } });
    const last = calls.at(-1)!;
    expect(last).toMatchObject({ kind: 'error', info: { code: 'engine_error' } });
    expect((last as { info: ErrorInfo }).info.message).toMatch(/^engine e failed mid-response: /);
    expect(calls.some((c) => c.kind === 'end')).toBe(false);
  });

  it('answers engine_unreachable, with no head, when nobody listens', async () => {
    const { relay, calls } = recordingRelay();
    const port = await freePort();
    const outcome = await client(`http://127.0.0.1:${port}`).call(
      '/v1/chat/completions',
      body(false),
      relay,
      new Cancellation(),
    );
    expect(outcome).toBe('engine_unreachable');
    expect(calls).toHaveLength(1);
    expect(calls[0]).toMatchObject({ kind: 'error', info: { code: 'engine_unreachable' } });
    expect((calls[0] as { info: ErrorInfo }).info.message).toMatch(/^engine e unreachable: /);
  });

  it('answers engine_timeout, not engine_unreachable, when the engine has the request and sends no head in time', async () => {
    // An engine still generating a non-streamed answer: vLLM sends its head only at the end.
    const requests: Array<{ body: Promise<string>; closed: Promise<unknown> }> = [];
    const engine = createServer((req) => {
      const chunks: Buffer[] = [];
      req.on('data', (c: Buffer) => chunks.push(c));
      requests.push({
        body: once(req, 'end').then(() => Buffer.concat(chunks).toString()),
        closed: once(req.socket, 'close'),
      });
    });
    engine.listen(0, '127.0.0.1');
    await once(engine, 'listening');
    try {
      const { port } = engine.address() as AddressInfo;
      const { relay, calls } = recordingRelay();
      const sent = body(false, 4000);
      const outcome = await client(`http://127.0.0.1:${port}`, 200).call(
        '/v1/chat/completions',
        sent,
        relay,
        new Cancellation(),
      );
      expect(outcome).toBe('engine_timeout');
      expect(calls).toEqual([
        {
          kind: 'error',
          info: {
            code: 'engine_timeout',
            message:
              'engine e did not answer within 0.2 s (ENGINE_HEADERS_TIMEOUT_MS; a non-streamed answer must be complete within it)',
          },
        },
      ]);
      // The engine had the whole request, and its connection is closed: vLLM aborts the
      // request then and frees its slot.
      expect(requests).toHaveLength(1);
      expect(await requests[0]!.body).toBe(sent);
      await requests[0]!.closed;
    } finally {
      engine.closeAllConnections();
      engine.close();
    }
  });

  it("sends the client's request id, trace context and data-parallel rank as vLLM reads them, beside the engine's key", async () => {
    // A stand-in engine that answers as vLLM would and keeps the headers of each request.
    const received: IncomingHttpHeaders[] = [];
    const engine = createServer((req, res) => {
      received.push(req.headers);
      req.resume();
      req.on('end', () => res.writeHead(200, { 'content-type': 'application/json' }).end('{}'));
    });
    engine.listen(0, '127.0.0.1');
    await once(engine, 'listening');
    try {
      const { port } = engine.address() as AddressInfo;
      const c = client(`http://127.0.0.1:${port}`, 10_000, 'engine-key');
      const traceparent = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01';
      const call = (context?: Parameters<EngineClient['call']>[5]) =>
        c.call(
          '/v1/chat/completions',
          body(false),
          recordingRelay().relay,
          new Cancellation(),
          {},
          context,
        );
      expect(
        await call({
          requestId: 'client-req-42',
          traceparent,
          tracestate: 'congo=t61rcWkgMzE',
          dataParallelRank: '1',
        }),
      ).toBe('ok');
      // A job from a gateway of the previous version: none of them, and nothing left over.
      expect(await call()).toBe('ok');
      expect(await call({ requestId: 'only-an-id' })).toBe('ok');
      expect(received).toHaveLength(3);
      expect(received[0]).toMatchObject({
        authorization: 'Bearer engine-key',
        'content-type': 'application/json',
        'x-request-id': 'client-req-42',
        traceparent,
        tracestate: 'congo=t61rcWkgMzE',
        'x-data-parallel-rank': '1',
      });
      const sent = ['x-request-id', 'traceparent', 'tracestate', 'x-data-parallel-rank'];
      for (const name of sent) expect(received[1]).not.toHaveProperty(name);
      expect(received[1]).toMatchObject({ authorization: 'Bearer engine-key' });
      expect(received[2]).toMatchObject({ 'x-request-id': 'only-an-id' });
      for (const name of sent.slice(1)) expect(received[2]).not.toHaveProperty(name);
    } finally {
      engine.closeAllConnections();
      engine.close();
    }
  });

  it('cancels before the call without reaching the engine, and during it with the reason given', async () => {
    const before = (await sim.state()).peakRequests;
    const early = new Cancellation();
    early.abort(new CancelledError('client went away'));
    const first = recordingRelay();
    expect(await client().call('/v1/chat/completions', body(true), first.relay, early)).toBe(
      'cancelled',
    );
    expect(first.calls).toEqual([
      {
        kind: 'error',
        info: { code: 'cancelled', message: 'request cancelled: client went away' },
      },
    ]);
    expect((await sim.state()).peakRequests).toBe(before);

    const during = new Cancellation();
    const second = recordingRelay();
    const outcome = await client().call(
      '/v1/chat/completions',
      body(true, 50),
      second.relay,
      during,
      {
        firstByte: () => during.abort(new CancelledError('its lock was lost', 'dispatcher_lost')),
      },
    );
    expect(outcome).toBe('cancelled');
    expect(second.calls[0]).toMatchObject({ kind: 'head', info: { status: 200 } });
    expect(second.calls.at(-1)).toEqual({
      kind: 'error',
      info: { code: 'dispatcher_lost', message: 'request cancelled: its lock was lost' },
    });
  });
});

describe('engine call time-outs', () => {
  // Prefills at 1000 tokens a second; like vLLM it sends a stream's head at once and its first
  // body byte with the first token.
  let slow: TestEngineSim;
  beforeAll(async () => {
    slow = await startEngineSim([
      ...['--profile', 'instant', '--model', 'm'],
      ...['--prefill-tokens-per-second', '1000'],
    ]);
  });
  afterAll(() => slow?.stop());
  const streamOf = (promptTokens: number) =>
    JSON.stringify({ ...JSON.parse(body(true, 5)), sim_prompt_tokens: promptTokens });

  it('lets a stream prefill for longer than the body time-out: its first token is bounded by the headers time-out', async () => {
    // Three seconds of prefill, fifteen body time-outs, well within the headers time-out.
    const { relay, calls } = recordingRelay();
    const outcome = await client(slow.url, 60_000, undefined, 200).call(
      '/v1/chat/completions',
      streamOf(3000),
      relay,
      new Cancellation(),
    );
    expect(calls.filter((c) => c.kind === 'error')).toEqual([]);
    expect(outcome).toBe('ok');
    expect(calls[0]).toMatchObject({ kind: 'head', info: { status: 200 } });
    expect(calls.at(-1)).toMatchObject({ kind: 'end' });
    const text = calls.map((c) => (c.kind === 'data' ? c.text : '')).join('');
    expect(text.endsWith('data: [DONE]\n\n')).toBe(true);
  });

  it('ends a stream whose prefill outlasts the headers time-out with engine_timeout after its head, and the engine drops it', async () => {
    const { relay, calls } = recordingRelay();
    // Twenty seconds of prefill against a headers time-out of 0.3 s.
    const outcome = await client(slow.url, 300).call(
      '/v1/chat/completions',
      streamOf(20_000),
      relay,
      new Cancellation(),
    );
    expect(outcome).toBe('engine_timeout');
    expect(calls).toEqual([
      {
        kind: 'head',
        info: { status: 200, contentType: expect.stringContaining('text/event-stream') },
      },
      {
        kind: 'error',
        info: {
          code: 'engine_timeout',
          message:
            "engine e sent no token within 0.3 s of its response head (ENGINE_HEADERS_TIMEOUT_MS; a stream's prefill must end within it)",
        },
      },
    ]);
    // The connection closed with the time-out: the engine aborts the prefill.
    await eventually(async () => {
      const state = await slow.state();
      return state.running + state.waiting === 0;
    }, 'the engine to drop the request');
  });

  it('ends a stream that stops between chunks for longer than the body time-out with engine_error', async () => {
    const closed: Promise<unknown>[] = [];
    const engine = createServer((req, res) => {
      closed.push(once(req.socket, 'close'));
      req.resume();
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write('data: {"choices":[]}\n\n');
    });
    engine.listen(0, '127.0.0.1');
    await once(engine, 'listening');
    try {
      const { port } = engine.address() as AddressInfo;
      const { relay, calls } = recordingRelay();
      const outcome = await client(`http://127.0.0.1:${port}`, 10_000, undefined, 200).call(
        '/v1/chat/completions',
        body(true),
        relay,
        new Cancellation(),
      );
      expect(outcome).toBe('engine_error');
      expect(calls.map((c) => c.kind)).toEqual(['head', 'data', 'error']);
      expect(calls.at(-1)).toEqual({
        kind: 'error',
        info: {
          code: 'engine_error',
          message:
            'engine e failed mid-response: nothing for 0.2 s after the last chunk (ENGINE_BODY_TIMEOUT_MS)',
        },
      });
      await closed[0];
    } finally {
      engine.closeAllConnections();
      engine.close();
    }
  });
});
