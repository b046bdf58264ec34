// Key guessing against a real gateway (real Redis from the harness): a tenant key too short to
// be a credential stops the gateway at start-up, naming where it is but not the key; an
// address that presented GATEWAY_AUTH_FAILURE_LIMIT wrong keys gets 429 auth_throttled with
// Retry-After, its right key included, while another address (a second loopback address,
// and a client named by a trusted proxy) is served. The window is long (10 minutes) so that
// no step of the test can outlast it: nothing here depends on timing.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { request } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  sluiceBin,
  startGateway,
  startProcess,
  startRedis,
  type SluiceProcess,
  type TestRedis,
} from '../support/index.ts';

const KEY = 'sk-alpha-auth-throttle-5e0b9c1d7a3f4e2b';
const WRONG = 'sk-wrong-auth-throttle-000000000000000';
const LIMIT = 3;
const WINDOW_SECONDS = 600;
/** The trusted proxy: a second loopback address (Linux routes all of 127/8 to lo). */
const PROXY = '127.0.0.2';

let dir: string;
let redis: TestRedis;
let gateway: SluiceProcess;

/** The pools file with one tenant whose key is `key`. */
function configFile(name: string, key: string): string {
  const file = join(dir, name);
  writeFileSync(
    file,
    [
      'pools:',
      '  - { name: p, models: [m], engines: [{ url: "http://127.0.0.1:9" }] }',
      'tenants:',
      '  - name: alpha',
      `    apiKeys: [${key}]`,
      '',
    ].join('\n'),
  );
  return file;
}

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'sluice-auth-throttle-'));
  redis = await startRedis();
  gateway = await startGateway({
    REDIS_URL: redis.url,
    SLUICE_CONFIG: configFile('sluice.yaml', KEY),
    GATEWAY_AUTH_FAILURE_LIMIT: String(LIMIT),
    GATEWAY_AUTH_FAILURE_WINDOW_SECONDS: String(WINDOW_SECONDS),
    GATEWAY_TRUST_PROXY: PROXY,
  });
}, 60_000);

afterAll(async () => {
  await gateway?.stop();
  await redis?.stop();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

interface Reply {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  body: string;
}

/** GET `path` from the source address `from`, with `key` as the bearer key (none if null). */
function get(
  path: string,
  key: string | null,
  from = '127.0.0.1',
  headers: Record<string, string> = {},
): Promise<Reply> {
  const { hostname, port } = new URL(gateway.url);
  return new Promise((resolve, reject) => {
    const req = request(
      {
        host: hostname,
        port,
        path,
        localAddress: from,
        agent: false,
        headers: { ...headers, ...(key === null ? {} : { authorization: `Bearer ${key}` }) },
      },
      (res) => {
        let body = '';
        res.setEncoding('utf8');
        res.on('data', (chunk: string) => (body += chunk));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body }));
        res.on('error', reject);
      },
    );
    req.on('error', reject);
    req.end();
  });
}

/** `sluice_rejected_total{reason}` summed over models, read with the right key. */
async function rejected(reason: string, from: string): Promise<number> {
  const res = await get('/metrics', KEY, from);
  expect(res.status).toBe(200);
  return res.body
    .split('\n')
    .filter((l) => l.startsWith('sluice_rejected_total{') && l.includes(`reason="${reason}"`))
    .reduce((sum, l) => sum + Number(l.split(' ').pop()), 0);
}

describe('a tenant key too short to be a credential', () => {
  it('stops the gateway at start-up with exit 2 and one line naming the entry, not the key', async () => {
    const file = configFile('weak.yaml', 'test');
    const proc = await startProcess({
      command: process.execPath,
      args: [sluiceBin, 'gateway'],
      env: {
        LOG_LEVEL: 'info',
        HOST: '127.0.0.1',
        PORT: '0',
        REDIS_URL: redis.url,
        SLUICE_CONFIG: file,
      },
      ready: /sluice gateway:/,
      timeoutMs: 45_000,
    });
    const { code } = await proc.closed;
    expect(code).toBe(2);
    expect(proc.stderr).toEqual([
      `sluice gateway: ${file}: tenants[0].apiKeys[0]=(hidden, 4 characters) is invalid: expected a key of at least 32 characters, random (e.g. sk-$(openssl rand -hex 24)): a short key can be guessed`,
    ]);
    expect(proc.output.join('\n')).not.toMatch(/\btest\b/);
  });
});

describe('wrong keys from one address', () => {
  it(`answer 401 up to ${LIMIT}, then 429 auth_throttled with Retry-After, the right key included; another address is served`, async () => {
    // Another address first: served, and its right key counts nothing.
    expect((await get('/v1/models', KEY, PROXY)).status).toBe(200);
    const throttledBefore = await rejected('auth_throttled', PROXY);

    for (let i = 0; i < LIMIT; i++) {
      const res = await get('/v1/models', WRONG);
      expect(res.status).toBe(401);
      expect(JSON.parse(res.body).error.code).toBe('invalid_api_key');
    }
    for (const key of [WRONG, KEY, null]) {
      const res = await get('/v1/models', key);
      expect(res.status).toBe(429);
      expect(res.headers['x-sluice-reject-reason']).toBe('auth_throttled');
      const retryAfter = Number(res.headers['retry-after']);
      expect(retryAfter).toBeGreaterThanOrEqual(1);
      expect(retryAfter).toBeLessThanOrEqual(WINDOW_SECONDS);
      expect(JSON.parse(res.body).error).toMatchObject({
        type: 'rate_limit_error',
        code: 'auth_throttled',
      });
      expect(res.body).not.toContain('sk-');
    }
    // The probes stay open to it.
    expect((await get('/healthz', null)).status).toBe(200);

    // Another source address, and a client a trusted proxy names, are served with the key.
    expect((await get('/v1/models', KEY, PROXY)).status).toBe(200);
    const viaProxy = { 'x-forwarded-for': '203.0.113.7' };
    expect((await get('/v1/models', KEY, PROXY, viaProxy)).status).toBe(200);
    // That client's wrong keys are its own, not the proxy's.
    for (let i = 0; i < LIMIT; i++)
      expect((await get('/v1/models', WRONG, PROXY, viaProxy)).status).toBe(401);
    expect((await get('/v1/models', KEY, PROXY, viaProxy)).status).toBe(429);
    expect((await get('/v1/models', KEY, PROXY)).status).toBe(200);

    expect(await rejected('auth_throttled', PROXY)).toBe(throttledBefore + 4);
  });
});
