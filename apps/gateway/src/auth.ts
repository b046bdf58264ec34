// Tenants at the edge: with `tenants` configured, every request except the open operations
// paths needs `Authorization: Bearer <key>`, and the key names the request's tenant. Without
// tenants nothing is asked for and every request is anonymous (`request.tenant` null).
import { timingSafeEqual } from 'node:crypto';
import { keyDigest, type TenantConfig } from '@sluice/config';
import type { FastifyInstance, FastifyReply } from 'fastify';
import type { AuthThrottle } from './auth-throttle.js';
import { refusal, type Refusal } from './refuse.js';

declare module 'fastify' {
  interface FastifyRequest {
    /** The caller's tenant (set by the auth hook); null when no tenants are configured. */
    tenant: TenantConfig | null;
  }
}

/**
 * Open without a key: probes carry none (`/health` is vLLM's, which load balancers written
 * for vLLM probe). Exact paths only, so everything else, unknown paths included, is behind
 * the key (a 404 tells a stranger nothing either).
 */
export const OPEN_PATHS: ReadonlySet<string> = new Set(['/healthz', '/readyz', '/health']);

/**
 * `/metrics` on the API port lists every tenant's name, volumes and error rates, and every
 * model name: with tenants it needs a key like `/v1/models` (any tenant's: a scraper is given
 * one). Open only when GATEWAY_METRICS_PORT serves it elsewhere: the API port then answers
 * it 404, key or not, as it always did.
 */
export const METRICS_PATH = '/metrics';

const NO_KEY =
  "You didn't provide an API key. You need to provide your API key in an Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).";
const MALFORMED =
  'The Authorization header is not of the form "Bearer YOUR_KEY". You need to provide your API key in an Authorization header using Bearer auth.';
// Never the key itself, not even a masked part of it: it may sit in a client's logs.
const INCORRECT = 'Incorrect API key provided.';
/** The one refusal of a key that was presented and is no tenant's: what the throttle counts. */
const WRONG_KEY: Refusal = refusal('invalid_api_key', INCORRECT);
const THROTTLED =
  'Too many incorrect API keys from this address. Your key was not checked; retry after the time in Retry-After.';

// vLLM's scheme check (case-insensitive `bearer`, one space); a key has no blanks.
const BEARER = /^bearer +(\S+) *$/i;

/** Every tenant's key digests, resolved once at start-up. */
export class TenantKeys {
  private readonly byDigest = new Map<string, { digest: Buffer; tenant: TenantConfig }>();

  constructor(tenants: readonly TenantConfig[]) {
    for (const tenant of tenants)
      for (const hex of tenant.keySha256)
        this.byDigest.set(hex, { digest: Buffer.from(hex, 'hex'), tenant });
  }

  /** The tenant of an `Authorization` header value, or the refusal for it. */
  authenticate(header: string | undefined): TenantConfig | Refusal {
    if (header === undefined || header.trim() === '') return refusal('invalid_api_key', NO_KEY);
    const key = BEARER.exec(header)?.[1];
    if (key === undefined) return refusal('invalid_api_key', MALFORMED);
    // The presented key is hashed first, so the Map lookup's timing depends only on its
    // digest, which a caller cannot steer towards a stored one (that would need a SHA-256
    // preimage): comparing digests leaks nothing about any stored key. The constant-time
    // compare then confirms the match without an early exit.
    const hex = keyDigest(key);
    const entry = this.byDigest.get(hex);
    if (entry === undefined || !timingSafeEqual(entry.digest, Buffer.from(hex, 'hex')))
      return WRONG_KEY;
    return entry.tenant;
  }
}

/** Whether a refusal of `authenticate` is for a wrong key (not a missing or malformed one). */
export const isWrongKey = (r: Refusal): boolean => r === WRONG_KEY;

/** The highest priority a request may ask for: its tenant's, else SLUICE_MAX_PRIORITY. */
export function priorityCap(tenant: TenantConfig | null, maxPriority: number): number {
  return tenant === null ? maxPriority : Math.min(tenant.maxPriority, maxPriority);
}

export interface AuthOptions {
  /**
   * True when GATEWAY_METRICS_PORT serves `/metrics` on a port of its own (the API port's
   * `/metrics` is then a 404, open as before); false (the default) keeps it behind the key.
   */
  metricsElsewhere?: boolean;
  /**
   * Wrong keys per client address (`request.ip`, see GATEWAY_TRUST_PROXY): an address past
   * its limit gets 429 `auth_throttled` before its key is looked at. Absent: no throttle.
   */
  throttle?: AuthThrottle;
}

/**
 * Installs `request.tenant` and, with tenants, the key check: an `onRequest` hook on the root
 * instance, so it runs before the body is read, for every route and for unknown ones.
 * Register it before the routes. A refusal is a 401 `invalid_api_key` through `refuse`
 * (counted), with `WWW-Authenticate` as RFC 9110 asks of a 401; with a `throttle`, an address
 * past its wrong keys gets 429 `auth_throttled` with `Retry-After` instead, right key or not
 * (answering a right key would tell the guesser it found one).
 */
export function installAuth(
  app: FastifyInstance,
  tenants: readonly TenantConfig[] | undefined,
  refuse: (reply: FastifyReply, r: Refusal) => FastifyReply,
  { metricsElsewhere = false, throttle }: AuthOptions = {},
): void {
  app.decorateRequest('tenant', null);
  if (tenants === undefined) return;
  const keys = new TenantKeys(tenants);
  app.addHook('onRequest', async (request, reply) => {
    const path = request.url.split('?', 1)[0]!;
    if (OPEN_PATHS.has(path) || (metricsElsewhere && path === METRICS_PATH)) return;
    // Fastify types it a string, but a socket already gone has no address.
    const address = (request.ip as string | undefined) ?? '';
    const wait = throttle?.retryAfter(address) ?? 0;
    if (wait > 0) return refuse(reply, refusal('auth_throttled', THROTTLED, wait));
    const found = keys.authenticate(request.headers.authorization);
    if ('reason' in found) {
      if (throttle !== undefined && isWrongKey(found)) throttle.failed(address);
      return refuse(reply.header('www-authenticate', 'Bearer realm="sluice"'), found);
    }
    request.tenant = found;
  });
}
