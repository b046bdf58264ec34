// Wrong API keys per client address: the throttle as a pure unit on an injected clock (worked
// examples, properties), then behind the key check on a real Fastify instance (requests
// injected from chosen addresses).
import { createHash } from 'node:crypto';
import type { TenantConfig } from '@sluice/config';
import fc from 'fast-check';
import Fastify, { type FastifyInstance, type FastifyReply } from 'fastify';
import { afterEach, describe, expect, it } from 'vitest';
import { installAuth } from '../src/auth.ts';
import { AuthThrottle, clientKey, type AuthThrottleOptions } from '../src/auth-throttle.ts';
import { refusalBody, refusalHeaders, type Refusal } from '../src/refuse.ts';

/** A throttle on a clock the test moves. */
function throttleAt(options: AuthThrottleOptions, start = 1_000) {
  const clock = { now: start };
  return { clock, throttle: new AuthThrottle(options, () => clock.now) };
}

describe('AuthThrottle: worked examples (limit 3, window 60 s)', () => {
  const options = { limit: 3, windowMs: 60_000, maxAddresses: 100 };

  it('refuses an address from its third wrong key to the end of the window that began with its first', () => {
    const { clock, throttle } = throttleAt(options, 0);
    throttle.failed('10.0.0.1'); // t=0: the window is [0, 60 s)
    clock.now = 1_000;
    expect(throttle.retryAfter('10.0.0.1')).toBe(0);
    throttle.failed('10.0.0.1');
    clock.now = 2_000;
    expect(throttle.retryAfter('10.0.0.1')).toBe(0);
    throttle.failed('10.0.0.1'); // the third: refused until t=60 s
    expect(throttle.retryAfter('10.0.0.1')).toBe(58);
    clock.now = 59_001;
    expect(throttle.retryAfter('10.0.0.1')).toBe(1);
    clock.now = 59_999.5;
    expect(throttle.retryAfter('10.0.0.1')).toBe(1);
    clock.now = 60_000;
    expect(throttle.retryAfter('10.0.0.1')).toBe(0);
  });

  it('counts each address on its own', () => {
    const { throttle } = throttleAt(options);
    for (let i = 0; i < 3; i++) throttle.failed('10.0.0.1');
    throttle.failed('10.0.0.2');
    expect(throttle.retryAfter('10.0.0.1')).toBe(60);
    expect(throttle.retryAfter('10.0.0.2')).toBe(0);
    expect(throttle.retryAfter('10.0.0.3')).toBe(0);
  });

  it('starts a new window, counting from one, with the first wrong key after the last one ended', () => {
    const { clock, throttle } = throttleAt(options, 0);
    for (let i = 0; i < 3; i++) throttle.failed('10.0.0.1');
    clock.now = 70_000;
    throttle.failed('10.0.0.1'); // the window is [70 s, 130 s), one wrong key in it
    throttle.failed('10.0.0.1');
    expect(throttle.retryAfter('10.0.0.1')).toBe(0);
    throttle.failed('10.0.0.1');
    expect(throttle.retryAfter('10.0.0.1')).toBe(60);
  });

  it('holds no entry for an address that never presented a wrong key', () => {
    const { throttle } = throttleAt(options);
    for (let i = 0; i < 1000; i++) expect(throttle.retryAfter(`10.0.${i >> 8}.${i & 255}`)).toBe(0);
    expect(throttle.size).toBe(0);
  });

  it('drops windows that have ended, and at the cap the one that started first', () => {
    const { clock, throttle } = throttleAt({ ...options, maxAddresses: 2 }, 0);
    for (let i = 0; i < 3; i++) throttle.failed('10.0.0.1'); // window [0, 60 s), refused
    clock.now = 10_000;
    throttle.failed('10.0.0.2');
    clock.now = 20_000;
    throttle.failed('10.0.0.3'); // the cap: 10.0.0.1, the oldest, is dropped
    expect(throttle.size).toBe(2);
    expect(throttle.retryAfter('10.0.0.1')).toBe(0);
    clock.now = 75_000;
    throttle.failed('10.0.0.4'); // 10.0.0.2's window ended at 70 s: dropped, no eviction
    expect(throttle.size).toBe(2);
    clock.now = 200_000;
    throttle.failed('10.0.0.5');
    expect(throttle.size).toBe(1);
  });
});

describe('clientKey', () => {
  it.each([
    ['10.1.2.3', '10.1.2.3'],
    ['::ffff:10.1.2.3', '10.1.2.3'],
    ['::FFFF:10.1.2.3', '10.1.2.3'],
    ['2001:db8:0:1::7', '2001:db8:0:1::/64'],
    ['2001:0db8:0000:0001:ffff:0:0:1', '2001:db8:0:1::/64'],
    ['2001:db8::1', '2001:db8:0:0::/64'],
    ['fe80::1%eth0', 'fe80:0:0:0::/64'],
    ['::1', '0:0:0:0::/64'],
    ['1:2:3:4:5:6:1.2.3.4', '1:2:3:4::/64'],
  ])('%s counts as %s', (address, key) => {
    expect(clientKey(address)).toBe(key);
  });

  it('keeps one host of a /64 together, and two /64s apart', () => {
    expect(clientKey('2001:db8:0:1:aaaa::1')).toBe(clientKey('2001:db8:0:1:bbbb:cccc:dddd:eeee'));
    expect(clientKey('2001:db8:0:1::1')).not.toBe(clientKey('2001:db8:0:2::1'));
  });

  it('bounds what is not an address (a proxy passing on anything) to 64 characters', () => {
    expect(clientKey('x'.repeat(1000))).toHaveLength(64);
    expect(clientKey(`1:2:3::4::5${'a'.repeat(100)}`)).toHaveLength(64);
  });
});

describe('AuthThrottle: properties', () => {
  /** Attempts from a few addresses at non-decreasing times, each a wrong key. */
  const attempts = fc.array(
    fc.record({ address: fc.integer({ min: 0, max: 3 }), dt: fc.integer({ min: 0, max: 20_000 }) }),
    { maxLength: 200 },
  );
  const config = fc.record({
    limit: fc.integer({ min: 1, max: 5 }),
    windowMs: fc.integer({ min: 1, max: 60_000 }),
  });

  /** Runs the hook's logic: a refused attempt is not checked; a checked one is a wrong key. */
  function run(options: AuthThrottleOptions, list: Array<{ address: number; dt: number }>) {
    const { clock, throttle } = throttleAt(options, 0);
    const checked = new Map<number, number[]>();
    const refusals: Array<{ address: number; at: number; retryAfter: number }> = [];
    for (const { address, dt } of list) {
      clock.now += dt;
      const retryAfter = throttle.retryAfter(`10.0.0.${address}`);
      if (retryAfter > 0) refusals.push({ address, at: clock.now, retryAfter });
      else {
        throttle.failed(`10.0.0.${address}`);
        checked.set(address, [...(checked.get(address) ?? []), clock.now]);
      }
      expect(throttle.size).toBeLessThanOrEqual(options.maxAddresses);
    }
    return { checked, refusals };
  }

  it('refuses only an address with `limit` keys checked within the last window, and says when to retry', () => {
    fc.assert(
      fc.property(config, attempts, ({ limit, windowMs }, list) => {
        const { checked, refusals } = run({ limit, windowMs, maxAddresses: 4 }, list);
        for (const { address, at, retryAfter } of refusals) {
          const recent = (checked.get(address) ?? []).filter((t) => t > at - windowMs && t <= at);
          expect(recent.length).toBeGreaterThanOrEqual(limit);
          expect(retryAfter).toBeGreaterThanOrEqual(1);
          expect(retryAfter).toBeLessThanOrEqual(Math.ceil(windowMs / 1000));
        }
      }),
    );
  });

  it('checks at most 2 x limit keys of one address within any span of one window', () => {
    fc.assert(
      fc.property(config, attempts, ({ limit, windowMs }, list) => {
        const { checked } = run({ limit, windowMs, maxAddresses: 4 }, list);
        for (const times of checked.values())
          for (let i = 0; i + 2 * limit < times.length; i++)
            expect(times[i + 2 * limit]! - times[i]!).toBeGreaterThanOrEqual(windowMs);
      }),
    );
  });

  it('never holds more than maxAddresses entries, whatever is sprayed at it', () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 1, max: 8 }),
        fc.array(fc.tuple(fc.ipV4(), fc.integer({ min: 0, max: 100 })), { maxLength: 300 }),
        (maxAddresses, list) => {
          const { clock, throttle } = throttleAt({ limit: 2, windowMs: 1_000, maxAddresses });
          for (const [address, dt] of list) {
            clock.now += dt;
            throttle.failed(address);
            expect(throttle.size).toBeLessThanOrEqual(maxAddresses);
          }
        },
      ),
    );
  });
});

// Behind the key check, as main.ts installs it.
const sha = (key: string) => createHash('sha256').update(key).digest('hex');
const ALPHA_KEY = 'sk-alpha-throttle-0123456789abcdef';
const tenants: TenantConfig[] = [
  { name: 'alpha', keySha256: [sha(ALPHA_KEY)], weight: 1, maxPriority: 0 },
];
const bearer = (key: string) => ({ authorization: `Bearer ${key}` });
const WRONG = bearer('sk-wrong-0000000000000000000000000000');

let app: FastifyInstance | undefined;
afterEach(async () => {
  await app?.close();
  app = undefined;
});

/** An edge with a throttle of 3 wrong keys a minute on a test clock; `trustProxy` as Fastify's. */
async function edge(trustProxy?: string[]) {
  const { clock, throttle } = throttleAt({ limit: 3, windowMs: 60_000, maxAddresses: 100 }, 0);
  const refused: Refusal[] = [];
  const handled: string[] = [];
  app = Fastify(trustProxy === undefined ? {} : { trustProxy });
  installAuth(
    app,
    tenants,
    (reply: FastifyReply, r: Refusal) => {
      refused.push(r);
      return reply.code(r.status).headers(refusalHeaders(r)).send(refusalBody(r));
    },
    { throttle },
  );
  const report = async (request: { ip: string; tenant: TenantConfig | null }) => {
    handled.push(request.ip);
    return { tenant: request.tenant?.name ?? null };
  };
  app.get('/v1/models', report);
  app.get('/healthz', report);
  await app.ready();
  const from = (remoteAddress: string, headers: Record<string, string> = {}, url = '/v1/models') =>
    app!.inject({ method: 'GET', url, remoteAddress, headers });
  return { app, clock, throttle, refused, handled, from };
}

describe('the key check with the throttle', () => {
  it('answers 429 auth_throttled with Retry-After once an address had its wrong keys, right key or not, until the window ends', async () => {
    const { clock, refused, handled, from } = await edge();
    for (let i = 0; i < 3; i++) expect((await from('10.0.0.1', WRONG)).statusCode).toBe(401);

    clock.now = 15_000;
    const wrong = await from('10.0.0.1', WRONG);
    expect(wrong.statusCode).toBe(429);
    expect(wrong.headers['retry-after']).toBe('45');
    expect(wrong.headers['x-sluice-reject-reason']).toBe('auth_throttled');
    expect(wrong.headers['www-authenticate']).toBeUndefined();
    expect(wrong.json()).toEqual({
      error: {
        message: expect.stringMatching(/^Too many incorrect API keys from this address\./),
        type: 'rate_limit_error',
        param: null,
        code: 'auth_throttled',
      },
    });
    // The right key from the same address: not checked, so not told it is right.
    const right = await from('10.0.0.1', bearer(ALPHA_KEY));
    expect([right.statusCode, right.headers['retry-after']]).toEqual([429, '45']);
    // Another address is served; the probes stay open to the throttled one.
    expect((await from('10.0.0.2', bearer(ALPHA_KEY))).json()).toEqual({ tenant: 'alpha' });
    expect((await from('10.0.0.1', {}, '/healthz')).statusCode).toBe(200);
    expect(handled).toEqual(['10.0.0.2', '10.0.0.1']);

    clock.now = 60_000; // the window [0, 60 s) has ended
    expect((await from('10.0.0.1', bearer(ALPHA_KEY))).json()).toEqual({ tenant: 'alpha' });
    expect(refused.map((r) => r.reason)).toEqual([
      ...Array<string>(3).fill('invalid_api_key'),
      'auth_throttled',
      'auth_throttled',
    ]);
  });

  it('counts only keys presented and wrong: a missing or malformed header guesses nothing', async () => {
    const { throttle, from } = await edge();
    for (let i = 0; i < 10; i++) {
      expect((await from('10.0.0.1')).statusCode).toBe(401);
      expect((await from('10.0.0.1', { authorization: 'Basic abc' })).statusCode).toBe(401);
    }
    expect(throttle.size).toBe(0);
  });

  it('adds nothing for requests with the right key', async () => {
    const { throttle, from } = await edge();
    for (let i = 0; i < 10; i++)
      expect((await from(`10.0.0.${i}`, bearer(ALPHA_KEY))).statusCode).toBe(200);
    expect(throttle.size).toBe(0);
  });

  it('counts the addresses of one IPv6 /64 as one client', async () => {
    const { from } = await edge();
    for (const host of ['1', '2', '3'])
      expect((await from(`2001:db8:0:1::${host}`, WRONG)).statusCode).toBe(401);
    expect((await from('2001:db8:0:1:ffff::9', bearer(ALPHA_KEY))).statusCode).toBe(429);
    expect((await from('2001:db8:0:2::1', bearer(ALPHA_KEY))).statusCode).toBe(200);
  });

  it('counts the client a trusted proxy names (GATEWAY_TRUST_PROXY), not the proxy', async () => {
    const { from } = await edge(['127.0.0.1']);
    const viaProxy = (client: string, headers: Record<string, string>) =>
      from('127.0.0.1', { ...headers, 'x-forwarded-for': client });
    for (let i = 0; i < 3; i++) await viaProxy('203.0.113.7', WRONG);
    expect((await viaProxy('203.0.113.7', bearer(ALPHA_KEY))).statusCode).toBe(429);
    expect((await viaProxy('203.0.113.8', bearer(ALPHA_KEY))).statusCode).toBe(200);
    // A client that is not a trusted proxy cannot name another address.
    for (let i = 0; i < 3; i++) await from('10.0.0.9', { ...WRONG, 'x-forwarded-for': '1.1.1.1' });
    expect((await from('10.0.0.9', bearer(ALPHA_KEY))).statusCode).toBe(429);
    expect((await viaProxy('1.1.1.1', bearer(ALPHA_KEY))).statusCode).toBe(200);
  });
});
