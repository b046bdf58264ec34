// The access log and response metrics on a real Fastify logger (pino, writing to a stream the
// test reads) and a real prom-client registry; the request id on an injected request.
import { gatewayMetrics, loggerOptions, Registry } from '@sluice/observability';
import { refusal } from '@sluice/protocol';
import { jsonLines } from '@sluice/test/support';
import Fastify, { type FastifyInstance } from 'fastify';
import { afterEach, describe, expect, it } from 'vitest';
import {
  isCompletionRequest,
  refusedEnd,
  requestEnded,
  type RequestEnd,
} from '../src/access-log.ts';
import { heldEnd } from '../src/held-hooks.ts';
import type { HeldRequest } from '../src/held-request.ts';
import {
  installRequestId,
  MAX_REQUEST_ID_LENGTH,
  REQUEST_ID_HEADER,
  requestId,
} from '../src/request-id.ts';

let app: FastifyInstance | undefined;
afterEach(async () => {
  await app?.close();
  app = undefined;
});

/** A Fastify instance whose log lines land in `lines`, with the gateway's logger options. */
function logged() {
  const { stream, lines } = jsonLines();
  app = Fastify({ logger: { ...loggerOptions('info', 'gateway'), stream } });
  return { app, lines };
}

async function value(registry: Registry, name: string, labels: Record<string, string>) {
  // A histogram's samples are named `<name>_sum`, `<name>_count`, `<name>_bucket`.
  const samples = (await registry.getMetricsAsJSON()).flatMap((m) =>
    m.values.map((v) => ({ ...v, name: (v as { metricName?: string }).metricName ?? m.name })),
  );
  const found = samples.find(
    (v) =>
      v.name === name && Object.entries(labels).every(([k, want]) => String(v.labels[k]) === want),
  );
  return found?.value ?? 0;
}

const served: RequestEnd = {
  id: 'req-1',
  jobId: 'job-1',
  model: 'm',
  pool: 'p',
  tenant: 'alpha',
  stream: true,
  status: 200,
  queueWaitMs: 12,
  ttftMs: 30,
  durationMs: 250,
  promptTokens: 7,
  completionTokens: 5,
};

describe('access log and response metrics', () => {
  it('writes one info line with the fields and moves the response, duration, token and tenant series', async () => {
    const { app, lines } = logged();
    const registry = new Registry();
    const metrics = gatewayMetrics(registry);
    requestEnded(app.log, metrics, true)(served);
    await new Promise((resolve) => setImmediate(resolve));
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatchObject({ level: 30, kind: 'access', msg: 'request', ...served });
    expect(await value(registry, 'sluice_responses_total', { model: 'm', code: '200' })).toBe(1);
    expect(
      await value(registry, 'sluice_tenant_responses_total', { tenant: 'alpha', code: '200' }),
    ).toBe(1);
    expect(await value(registry, 'sluice_tokens_total', { model: 'm', kind: 'prompt' })).toBe(7);
    expect(await value(registry, 'sluice_tokens_total', { model: 'm', kind: 'completion' })).toBe(
      5,
    );
    expect(
      await value(registry, 'sluice_request_duration_seconds_sum', { model: 'm' }),
    ).toBeCloseTo(0.25);
  });

  it('off: the metrics still move, no line is written', async () => {
    const { app, lines } = logged();
    const registry = new Registry();
    requestEnded(app.log, gatewayMetrics(registry), false)({ ...served, status: 503 });
    await new Promise((resolve) => setImmediate(resolve));
    expect(lines).toEqual([]);
    expect(await value(registry, 'sluice_responses_total', { model: 'm', code: '503' })).toBe(1);
  });
});

/** The HeldRequest fields heldEnd reads. */
function held(fields: Partial<HeldRequest>): HeldRequest {
  return {
    jobId: 'j',
    stream: false,
    receivedAt: 1000,
    status: 200,
    reason: undefined,
    queueWaitMs: 5,
    firstByteAt: 1100,
    tokens: undefined,
    ...fields,
  } as HeldRequest;
}

const info = { id: 'r', model: 'm', tenant: 't', promptTokens: 40 };

describe('heldEnd', () => {
  it("counts the engine's usage for a whole answer", () => {
    const end = heldEnd(
      held({ tokens: { promptTokens: 9, completionTokens: 3 } }),
      'p',
      info,
      1500,
    );
    expect(end).toMatchObject({
      id: 'r',
      jobId: 'j',
      pool: 'p',
      tenant: 't',
      status: 200,
      queueWaitMs: 5,
      ttftMs: 100,
      durationMs: 500,
      promptTokens: 9,
      completionTokens: 3,
    });
    expect(end.promptTokensEstimated).toBeUndefined();
  });

  it("takes the gateway's prompt estimate when the engine sent no usage, and says so", () => {
    const end = heldEnd(held({ stream: true, tokens: { completionTokens: 4 } }), 'p', info, 1500);
    expect(end).toMatchObject({
      promptTokens: 40,
      completionTokens: 4,
      promptTokensEstimated: true,
    });
  });

  it('counts no tokens for an answer Sluice ended or the engine refused', () => {
    const tokens = { promptTokens: 9, completionTokens: 3 };
    for (const fields of [
      { status: 499, reason: 'cancelled', tokens },
      { status: 503, reason: 'dispatcher_lost', tokens },
      { status: 400, tokens },
    ]) {
      const end = heldEnd(held(fields), 'p', info, 1500);
      expect(end.promptTokens).toBeUndefined();
      expect(end.completionTokens).toBeUndefined();
    }
    // Queued and refused: no first byte, no queue wait.
    const refused = heldEnd(
      held({ status: 503, reason: 'queue_full', firstByteAt: undefined, queueWaitMs: undefined }),
      'p',
      info,
      1010,
    );
    expect(refused.ttftMs).toBeUndefined();
    expect(refused.queueWaitMs).toBeUndefined();
    expect(refused.durationMs).toBe(10);
  });
});

describe('x-request-id', () => {
  it("keeps a client's safe id and replaces any other with a UUID", () => {
    expect(requestId('abc-123_X.y:z')).toBe('abc-123_X.y:z');
    const uuid = /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;
    expect(requestId('x'.repeat(MAX_REQUEST_ID_LENGTH))).toBe('x'.repeat(MAX_REQUEST_ID_LENGTH));
    for (const bad of [
      undefined,
      '',
      'x'.repeat(MAX_REQUEST_ID_LENGTH + 1),
      'has space',
      'line\nbreak',
      '"quoted"',
      'ünïcode',
      ['a', 'b'],
    ])
      expect(requestId(bad)).toMatch(uuid);
    expect(requestId(undefined)).not.toBe(requestId(undefined));
  });

  it('returns the id on answers Fastify sends and on answers written by hand', async () => {
    app = Fastify({ genReqId: (req) => requestId(req.headers[REQUEST_ID_HEADER]) });
    installRequestId(app, () => 42);
    const ends: RequestEnd[] = [];
    app.post('/v1/completions', (request, reply) => {
      ends.push(refusedEnd(request, 'unknown', refusal('bad_request', 'no'), 50));
      expect(isCompletionRequest(request)).toBe(true);
      return reply.code(400).send({});
    });
    app.post('/raw', (_request, reply) => {
      reply.hijack();
      reply.raw.writeHead(200, { 'content-type': 'text/plain' });
      reply.raw.end('ok');
    });
    const sent = await app.inject({
      method: 'POST',
      url: '/v1/completions',
      headers: { [REQUEST_ID_HEADER]: 'client-id-1' },
      payload: {},
    });
    expect(sent.headers[REQUEST_ID_HEADER]).toBe('client-id-1');
    expect(ends).toEqual([
      { id: 'client-id-1', model: 'unknown', status: 400, reason: 'bad_request', durationMs: 8 },
    ]);
    const raw = await app.inject({
      method: 'POST',
      url: '/raw',
      headers: { [REQUEST_ID_HEADER]: 'bad id!' },
    });
    expect(raw.headers[REQUEST_ID_HEADER]).toMatch(/^[0-9a-f-]{36}$/);
    const missing = await app.inject({ method: 'GET', url: '/nowhere' });
    expect(missing.statusCode).toBe(404);
    expect(missing.headers[REQUEST_ID_HEADER]).toMatch(/^[0-9a-f-]{36}$/);
  });
});
