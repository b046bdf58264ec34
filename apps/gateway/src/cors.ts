// CORS, as vLLM answers it, so a browser client written for vLLM works through Sluice.
// vLLM's OpenAI server (`build_app` in vllm/entrypoints/openai/api_server.py) installs
// Starlette's CORSMiddleware with `--allowed-origins`, `--allow-credentials`,
// `--allowed-methods` and `--allowed-headers`, which default to ["*"], false, ["*"] and ["*"]
// (`FrontendArgs` in vllm/entrypoints/openai/cli_args.py): GATEWAY_CORS_* here. The answers
// are those of starlette/middleware/cors.py:
// - no `Origin`: nothing is added;
// - a preflight (`OPTIONS` with `Origin` and `Access-Control-Request-Method`) is answered at
//   once, before the key check (a browser sends no `Authorization` on one): 200 `OK`, or 400
//   `Disallowed CORS origin` (`, method`, `, headers`) naming what is not allowed;
// - any other request with `Origin` goes on, its answer carrying `Access-Control-Allow-Origin`
//   (`*`, or the origin itself when listed, with `Vary: Origin`), `-Allow-Credentials` and
//   `-Expose-Headers`.
// One difference: vLLM's key check (AuthenticationMiddleware) sits outside its CORS, so its
// 401 carries no CORS headers and a browser cannot read it; here every answer to an allowed
// origin carries them, refusals included, so the client reads Sluice's error.
//
// Not @fastify/cors: it sets its headers with `reply.header()`, which only answers sent
// through Fastify's reply carry; the gateway writes held requests, event streams, refusals of
// held requests and pass-through answers on `reply.raw` (reply.hijack()), and those would go
// out without them. Its preflight is a 204 that never refuses an origin, method or header,
// and it adds an `OPTIONS *` route. The headers here go on `reply.raw` (as x-request-id's do),
// so `writeHead` on any path merges them in.
import type { CorsConfig } from '@sluice/config';
import { sluiceHeaders } from '@sluice/protocol';
import type { FastifyInstance } from 'fastify';
import type { IncomingHttpHeaders } from 'node:http';
import { REQUEST_ID_HEADER } from './request-id.js';

/** What `*` in GATEWAY_CORS_ALLOWED_METHODS means: Starlette's ALL_METHODS. */
export const ALL_METHODS = ['DELETE', 'GET', 'HEAD', 'OPTIONS', 'PATCH', 'POST', 'PUT'] as const;

/** Request headers a preflight may always ask for: Starlette's SAFELISTED_HEADERS. */
export const SAFELISTED_HEADERS = ['Accept', 'Accept-Language', 'Content-Language', 'Content-Type'];

/** Starlette's default `max_age` (vLLM sets none): how long a browser may cache a preflight. */
export const PREFLIGHT_MAX_AGE_SECONDS = 600;

/**
 * Sluice's own response headers, which a page's script may read (`Retry-After` to back off,
 * the refusal reason, the request id to report). vLLM exposes none; it sends none of these.
 */
export const EXPOSED_HEADERS = [
  REQUEST_ID_HEADER,
  'retry-after',
  sluiceHeaders.rejectReason,
  sluiceHeaders.loadState,
  sluiceHeaders.engine,
];

export interface PreflightAnswer {
  status: 200 | 400;
  headers: Record<string, string>;
  body: string;
}

/** A CorsConfig worked out once at start-up: per request, a lookup or two. */
export class CorsPolicy {
  private readonly allowAllOrigins: boolean;
  private readonly origins: ReadonlySet<string>;
  private readonly methods: ReadonlySet<string>;
  private readonly allowAllHeaders: boolean;
  /** Lower-cased: what a preflight may ask for. */
  private readonly headers: ReadonlySet<string>;
  /** Origin echoed (with Vary) on a preflight, rather than `*`. */
  private readonly explicitPreflightOrigin: boolean;
  private readonly preflightHeaders: Record<string, string>;
  private readonly simpleHeaders: readonly [string, string][];

  constructor(config: CorsConfig) {
    this.allowAllOrigins = config.allowedOrigins === '*';
    this.origins = new Set(config.allowedOrigins === '*' ? [] : config.allowedOrigins);
    const methods = config.allowedMethods === '*' ? ALL_METHODS : config.allowedMethods;
    this.methods = new Set(methods);
    this.allowAllHeaders = config.allowedHeaders === '*';
    // Starlette: sorted(SAFELISTED_HEADERS | set(allow_headers)), listed as written. A name that
    // differs from a safelisted one only in case is not listed twice.
    const safelisted = new Set(SAFELISTED_HEADERS.map((h) => h.toLowerCase()));
    const listed = [
      ...SAFELISTED_HEADERS,
      ...(config.allowedHeaders === '*' ? [] : config.allowedHeaders).filter(
        (h) => !safelisted.has(h.toLowerCase()),
      ),
    ].sort();
    this.headers = new Set(listed.map((h) => h.toLowerCase()));
    this.explicitPreflightOrigin = !this.allowAllOrigins || config.allowCredentials;

    const preflight: Record<string, string> = {};
    if (this.explicitPreflightOrigin) preflight.vary = 'Origin';
    else preflight['access-control-allow-origin'] = '*';
    preflight['access-control-allow-methods'] = methods.join(', ');
    preflight['access-control-max-age'] = String(PREFLIGHT_MAX_AGE_SECONDS);
    if (!this.allowAllHeaders) preflight['access-control-allow-headers'] = listed.join(', ');
    if (config.allowCredentials) preflight['access-control-allow-credentials'] = 'true';
    this.preflightHeaders = preflight;

    const simple: [string, string][] = [];
    if (this.allowAllOrigins) simple.push(['access-control-allow-origin', '*']);
    if (config.allowCredentials) simple.push(['access-control-allow-credentials', 'true']);
    simple.push(['access-control-expose-headers', EXPOSED_HEADERS.join(', ')]);
    this.simpleHeaders = simple;
  }

  isAllowedOrigin(origin: string): boolean {
    return this.allowAllOrigins || this.origins.has(origin);
  }

  /** Starlette's `preflight_response`: 200 `OK`, or 400 naming what is not allowed. */
  preflight(origin: string, request: IncomingHttpHeaders): PreflightAnswer {
    const headers = { ...this.preflightHeaders };
    const failures: string[] = [];
    if (!this.isAllowedOrigin(origin)) failures.push('origin');
    else if (this.explicitPreflightOrigin) headers['access-control-allow-origin'] = origin;
    const method = request['access-control-request-method'];
    if (typeof method !== 'string' || !this.methods.has(method)) failures.push('method');
    const asked = request['access-control-request-headers'];
    if (asked !== undefined) {
      if (this.allowAllHeaders) headers['access-control-allow-headers'] = asked;
      else if (asked.split(',').some((h) => !this.headers.has(h.trim().toLowerCase())))
        failures.push('headers');
    }
    return failures.length === 0
      ? { status: 200, headers, body: 'OK' }
      : { status: 400, headers, body: `Disallowed CORS ${failures.join(', ')}` };
  }

  /**
   * The headers every answer to a request from `origin` carries (Starlette's `simple_response`):
   * the origin itself, with `Vary: Origin`, when the allowed ones are listed and it is one, or
   * when any is allowed and the request carries a cookie (a credentialed request may not be
   * answered `*`).
   */
  responseHeaders(origin: string, hasCookie: boolean): readonly [string, string][] {
    const explicit = this.allowAllOrigins ? hasCookie : this.origins.has(origin);
    if (!explicit) return this.simpleHeaders;
    return [
      ...this.simpleHeaders.filter(([name]) => name !== 'access-control-allow-origin'),
      ['access-control-allow-origin', origin],
      ['vary', 'Origin'],
    ];
  }
}

/**
 * Installs CORS as an `onRequest` hook on the root instance. Register it after
 * installRequestId (a preflight's answer carries its id too) and before installAuth (a
 * preflight carries no key). A preflight is answered from the hook, through Fastify's reply;
 * any other request from an origin gets its headers on `reply.raw`, so answers written by hand
 * (held streams, refusals, pass-through) carry them as well as Fastify's.
 */
export function installCors(app: FastifyInstance, config: CorsConfig): void {
  const policy = new CorsPolicy(config);
  app.addHook('onRequest', (request, reply, done) => {
    const { origin } = request.headers;
    if (origin === undefined) return done();
    if (request.method === 'OPTIONS' && 'access-control-request-method' in request.headers) {
      const answer = policy.preflight(origin, request.headers);
      // Answered here: no key check, no route, nothing logged or counted as a completion.
      void reply
        .code(answer.status)
        .headers(answer.headers)
        .type('text/plain; charset=utf-8')
        .send(answer.body);
      return;
    }
    for (const [name, value] of policy.responseHeaders(origin, 'cookie' in request.headers))
      reply.raw.setHeader(name, value);
    done();
  });
}
