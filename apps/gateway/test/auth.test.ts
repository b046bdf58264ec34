// Keys and tenants at the edge: the key check on a real Fastify instance (requests injected),
// the priority cap of a tenant, and which key a pass-through backend gets.
import { createHash } from 'node:crypto';
import type { TenantConfig } from '@sluice/config';
import Fastify, { type FastifyInstance, type FastifyReply } from 'fastify';
import { afterEach, describe, expect, it } from 'vitest';
import { installAuth, priorityCap, TenantKeys, type AuthOptions } from '../src/auth.ts';
import { installErrorHandlers } from '../src/errors.ts';
import { backendAuthorization } from '../src/passthrough.ts';
import { refusalBody, refusalHeaders, type Refusal } from '../src/refuse.ts';
import { priorityOf } from '../src/routes/completions.ts';

const sha = (key: string) => createHash('sha256').update(key).digest('hex');
const ALPHA_KEY = 'sk-alpha-test-0001';
const BETA_KEY = 'sk-beta-test-0002';
const tenants: TenantConfig[] = [
  { name: 'alpha', keySha256: [sha(ALPHA_KEY)], weight: 1, maxPriority: 3 },
  { name: 'beta', keySha256: [sha('another'), sha(BETA_KEY)], weight: 2, maxPriority: 0 },
];

let app: FastifyInstance | undefined;
afterEach(async () => {
  await app?.close();
  app = undefined;
});

/** An edge like the gateway's: auth hook, error handlers, a route that reports the tenant. */
async function edge(configured: TenantConfig[] | undefined, options?: AuthOptions) {
  const refused: Refusal[] = [];
  const handled: string[] = [];
  const refuse = (reply: FastifyReply, _model: string, r: Refusal) => {
    refused.push(r);
    return reply.code(r.status).headers(refusalHeaders(r)).send(refusalBody(r));
  };
  app = Fastify();
  installAuth(app, configured, (reply, r) => refuse(reply, 'unknown', r), options);
  installErrorHandlers(app, {
    maxBodyBytes: 1024,
    requestTimeoutSeconds: 30,
    refuse,
    onRefused: (r) => refused.push(r),
  });
  const report = async (request: { url: string; tenant: TenantConfig | null }) => {
    handled.push(request.url);
    return { tenant: request.tenant?.name ?? null };
  };
  app.post('/v1/chat/completions', report);
  app.get('/v1/models', report);
  for (const path of ['/healthz', '/readyz', '/health', '/metrics']) app.get(path, report);
  await app.ready();
  return { app, refused, handled };
}

const bearer = (key: string) => ({ authorization: `Bearer ${key}` });

describe('with tenants configured', () => {
  it('refuses a request without a key: 401 invalid_api_key in the OpenAI shape, nothing handled', async () => {
    const { app, refused, handled } = await edge(tenants);
    const res = await app.inject({
      method: 'POST',
      url: '/v1/chat/completions',
      payload: { model: 'm', messages: [] },
    });
    expect(res.statusCode).toBe(401);
    expect(res.headers['x-sluice-reject-reason']).toBe('invalid_api_key');
    expect(res.headers['www-authenticate']).toBe('Bearer realm="sluice"');
    expect(res.headers['retry-after']).toBeUndefined();
    expect(res.json()).toEqual({
      error: {
        message: expect.stringMatching(/^You didn't provide an API key\./),
        type: 'invalid_request_error',
        param: null,
        code: 'invalid_api_key',
      },
    });
    expect(refused.map((r) => r.reason)).toEqual(['invalid_api_key']);
    expect(handled).toEqual([]);
  });

  it.each([
    ['an unknown key', 'Bearer sk-nobody-9999', /^Incorrect API key provided\.$/],
    ['a key of the wrong case', `Bearer ${ALPHA_KEY.toUpperCase()}`, /^Incorrect API key/],
    ['another scheme', `Basic ${ALPHA_KEY}`, /not of the form "Bearer YOUR_KEY"/],
    ['a bare key', ALPHA_KEY, /not of the form "Bearer YOUR_KEY"/],
    ['Bearer and nothing', 'Bearer ', /not of the form/],
    ['a key with a blank inside', `Bearer ${ALPHA_KEY} x`, /not of the form/],
    ['a blank header', '  ', /^You didn't provide an API key\./],
  ])('refuses %s, never echoing what was sent', async (_what, header, message) => {
    const { app, handled } = await edge(tenants);
    const res = await app.inject({
      method: 'GET',
      url: '/v1/models',
      headers: { authorization: header },
    });
    expect(res.statusCode).toBe(401);
    expect(res.json().error.code).toBe('invalid_api_key');
    expect(res.json().error.message).toMatch(message);
    expect(res.body).not.toContain('sk-');
    expect(handled).toEqual([]);
  });

  it('resolves each key to its tenant, by plain key or by digest, with any case of "bearer"', async () => {
    const { app } = await edge(tenants);
    const tenantOf = async (headers: Record<string, string>) =>
      (await app.inject({ method: 'GET', url: '/v1/models', headers })).json().tenant;
    expect(await tenantOf(bearer(ALPHA_KEY))).toBe('alpha');
    expect(await tenantOf(bearer(BETA_KEY))).toBe('beta');
    expect(await tenantOf({ authorization: `bearer ${BETA_KEY}` })).toBe('beta');
    expect(await tenantOf({ authorization: `BEARER  ${ALPHA_KEY}` })).toBe('alpha');
  });

  it('guards unknown paths too (401 before 404), and answers 404 to a valid key', async () => {
    const { app } = await edge(tenants);
    const anonymous = await app.inject({ method: 'GET', url: '/v1/nothing' });
    expect(anonymous.statusCode).toBe(401);
    expect((await app.inject({ method: 'GET', url: '/elsewhere' })).statusCode).toBe(401);
    const known = await app.inject({
      method: 'GET',
      url: '/v1/nothing',
      headers: bearer(ALPHA_KEY),
    });
    expect(known.statusCode).toBe(404);
    expect(known.json().error.code).toBe('not_found');
  });

  it('checks the key before reading the body: a bad body without a key is still a 401', async () => {
    const { app } = await edge(tenants);
    const res = await app.inject({
      method: 'POST',
      url: '/v1/chat/completions',
      headers: { 'content-type': 'text/plain' },
      payload: 'x'.repeat(4096),
    });
    expect(res.statusCode).toBe(401);
  });

  it("leaves the probes /healthz, /readyz and vLLM's /health open (query strings too), nothing else", async () => {
    const { app, handled } = await edge(tenants);
    for (const url of ['/healthz', '/readyz', '/health', '/readyz?scope=replica']) {
      const res = await app.inject({ method: 'GET', url });
      expect(res.statusCode, url).toBe(200);
      expect(res.json()).toEqual({ tenant: null });
    }
    expect(handled).toHaveLength(4);
    expect((await app.inject({ method: 'GET', url: '/healthz/' })).statusCode).toBe(401);
    expect((await app.inject({ method: 'GET', url: '/health/' })).statusCode).toBe(401);
  });

  it('keeps /metrics behind the key (it names every tenant, their volumes and the models), unless GATEWAY_METRICS_PORT serves it elsewhere', async () => {
    const { app, handled } = await edge(tenants);
    for (const url of ['/metrics', '/metrics?name[]=x']) {
      const res = await app.inject({ method: 'GET', url });
      expect(res.statusCode, url).toBe(401);
      expect(res.headers['x-sluice-reject-reason']).toBe('invalid_api_key');
    }
    expect(handled).toEqual([]);
    const keyed = await app.inject({ method: 'GET', url: '/metrics', headers: bearer(BETA_KEY) });
    expect(keyed.statusCode).toBe(200);
    expect(keyed.json()).toEqual({ tenant: 'beta' });
    await app.close();
    // Past the hook without a key, as before (the real API port then answers it 404).
    const elsewhere = (await edge(tenants, { metricsElsewhere: true })).app;
    const res = await elsewhere.inject({ method: 'GET', url: '/metrics' });
    expect(res.statusCode).toBe(200);
    expect(res.json()).toEqual({ tenant: null });
    expect((await elsewhere.inject({ method: 'GET', url: '/v1/models' })).statusCode).toBe(401);
  });
});

describe('without tenants', () => {
  it('asks for no key and leaves every request anonymous', async () => {
    const { app, refused } = await edge(undefined);
    const plain = await app.inject({ method: 'GET', url: '/v1/models' });
    expect(plain.statusCode).toBe(200);
    expect(plain.json()).toEqual({ tenant: null });
    const withKey = await app.inject({ method: 'GET', url: '/v1/models', headers: bearer('x') });
    expect(withKey.json()).toEqual({ tenant: null });
    expect((await app.inject({ method: 'GET', url: '/v1/nothing' })).statusCode).toBe(404);
    expect(refused.map((r) => r.reason)).toEqual(['not_found']);
  });
});

describe('TenantKeys', () => {
  it('returns the tenant object itself for a key, a refusal otherwise', () => {
    const keys = new TenantKeys(tenants);
    expect(keys.authenticate(`Bearer ${BETA_KEY}`)).toBe(tenants[1]);
    expect(keys.authenticate(undefined)).toMatchObject({ reason: 'invalid_api_key', status: 401 });
    // A stored digest presented as if it were the key is not the key.
    expect(keys.authenticate(`Bearer ${sha(ALPHA_KEY)}`)).toMatchObject({
      reason: 'invalid_api_key',
    });
  });
});

describe('the priority a request may use', () => {
  it("is clamped to the tenant's maxPriority, else to SLUICE_MAX_PRIORITY", () => {
    const [alpha, beta] = tenants as [TenantConfig, TenantConfig];
    expect(priorityOf('9', priorityCap(alpha, 10))).toBe(3);
    expect(priorityOf('2', priorityCap(alpha, 10))).toBe(2);
    expect(priorityOf('9', priorityCap(beta, 10))).toBe(0);
    expect(priorityOf('9', priorityCap(null, 10))).toBe(9);
    expect(priorityOf('99', priorityCap(null, 10))).toBe(10);
    // A tenant's bound never lifts the global one (loadConfig refuses that anyway).
    expect(priorityCap({ ...alpha, maxPriority: 50 }, 10)).toBe(10);
    expect(priorityOf(undefined, priorityCap(alpha, 10))).toBe(0);
    expect(priorityOf('-4', priorityCap(alpha, 10))).toBe(0);
  });
});

describe('what a pass-through backend gets as Authorization', () => {
  const client = 'Bearer sk-client';
  it("is the backend's own key whenever it has one", () => {
    const target = { url: 'http://tei:8080', apiKey: 'sk-tei' };
    expect(backendAuthorization(target, client, true)).toBe('Bearer sk-tei');
    expect(backendAuthorization(target, client, false)).toBe('Bearer sk-tei');
  });

  it("is nothing with tenants (the client's key is Sluice's), else the client's as before", () => {
    const target = { url: 'http://tei:8080' };
    expect(backendAuthorization(target, client, true)).toBeUndefined();
    expect(backendAuthorization(target, client, false)).toBe(client);
    expect(backendAuthorization(target, undefined, false)).toBeUndefined();
  });

  it("is a pool engine's own key or nothing, never the client's, as from the dispatcher", () => {
    const engine = { url: 'http://vllm:8000', engine: true as const };
    expect(backendAuthorization(engine, client, false)).toBeUndefined();
    expect(backendAuthorization(engine, client, true)).toBeUndefined();
    expect(backendAuthorization({ ...engine, apiKey: 'sk-e' }, client, false)).toBe('Bearer sk-e');
  });
});
