// Every answer the edge gives on its own is a refusal from the table, in the OpenAI error
// shape: errors that reach Fastify's error handler, unknown routes and methods, and the
// errors Node's HTTP parser answers before Fastify sees a request (431, 408, malformed HTTP).
// Only a bug answers 500.
import { STATUS_CODES, type IncomingMessage, type ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import type { FastifyError, FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { UNKNOWN_MODEL } from './labels.js';
import { refusal, refusalBody, refusalHeaders, type Refusal } from './refuse.js';

export interface EdgeErrorOptions {
  maxBodyBytes: number;
  requestTimeoutSeconds: number;
  refuse(reply: FastifyReply, model: string, r: Refusal): FastifyReply;
  /** Counts a refusal written straight to the socket. */
  onRefused(r: Refusal): void;
}

type HttpError = Pick<FastifyError, 'code' | 'message'> & { statusCode?: number };

/** The refusal for an error, or undefined when it is a bug (answered 500 and logged). */
export function refusalForError(
  error: HttpError,
  contentType: string | undefined,
  opts: Pick<EdgeErrorOptions, 'maxBodyBytes' | 'requestTimeoutSeconds'>,
): Refusal | undefined {
  switch (error.code) {
    case 'FST_ERR_CTP_BODY_TOO_LARGE':
      return bodyTooLarge(opts.maxBodyBytes);
    case 'FST_ERR_CTP_INVALID_MEDIA_TYPE':
      return refusal(
        'unsupported_media_type',
        `content-type must be application/json, got ${quote(contentType ?? '')}`,
      );
    case 'FST_ERR_CTP_EMPTY_JSON_BODY':
      return refusal('bad_request', 'request body is empty');
  }
  switch (error.statusCode) {
    case 404:
      return refusal('not_found', error.message);
    case 405:
      return refusal('method_not_allowed', error.message);
    case 408:
      return requestTimeout(opts.requestTimeoutSeconds);
    case 413:
      return bodyTooLarge(opts.maxBodyBytes);
    case 415:
      return refusal('unsupported_media_type', error.message);
    case 431:
      return refusal('headers_too_large', error.message);
  }
  if (error.statusCode && error.statusCode >= 400 && error.statusCode < 500)
    return refusal('bad_request', error.message);
  return undefined;
}

/** The refusal for an error of Node's HTTP parser or server, answered on the bare socket. */
export function refusalForClientError(
  error: Error & { code?: string },
  requestTimeoutSeconds: number,
): Refusal {
  if (error.code === 'ERR_HTTP_REQUEST_TIMEOUT') return requestTimeout(requestTimeoutSeconds);
  if (error.code === 'HPE_HEADER_OVERFLOW')
    return refusal('headers_too_large', 'request headers are larger than the server accepts');
  return refusal('bad_request', `malformed HTTP request (${error.code ?? error.message})`);
}

/**
 * True when the request declared a body that has not all arrived: an answer given before it
 * was read (a 401 from the key check, a refusal before the body, a route that reads none).
 */
export function bodyLeftUnread(req: IncomingMessage): boolean {
  if (req.complete) return false;
  const length = req.headers['content-length'];
  return (length !== undefined && length !== '0') || req.headers['transfer-encoding'] !== undefined;
}

/**
 * After an answer given before the request's body was read, Node would read the rest and drop
 * it to keep the connection alive, with no size bound and for up to
 * GATEWAY_REQUEST_TIMEOUT_SECONDS: a client without a key could stream gigabytes into the
 * gateway. The rest is dropped only up to `maxBytes` (MAX_BODY_BYTES, what a request with a
 * key may send), then the connection is cut. Not cut at once: the client is still sending,
 * and a socket closed with bytes unread sends a reset that can take the answer with it, so an
 * honest client with a wrong key would see a reset instead of its 401.
 */
export function boundUnreadBody(req: IncomingMessage, maxBytes: number): void {
  let dropped = 0;
  const count = (chunk: Buffer) => {
    dropped += chunk.length;
    // Destroying a request not received whole destroys its socket (Node's IncomingMessage);
    // a stand-in request (Fastify's inject) has a socket without destroy().
    if (dropped > maxBytes) req.destroy();
  };
  req.on('data', count);
  req.once('end', () => req.off('data', count));
}

/**
 * Fastify's `frameworkErrors`: a request Fastify refuses before routing (a URL that does not
 * decode, `FST_ERR_BAD_URL`) is answered as every other refusal, not in Fastify's own shape.
 */
export function frameworkErrorHandler(
  refuse: (reply: FastifyReply, r: Refusal) => FastifyReply,
): (error: FastifyError, request: FastifyRequest, reply: FastifyReply) => void {
  return (error, request, reply) => {
    const path = request.url.split('?', 1)[0]!;
    const r =
      error.code === 'FST_ERR_BAD_URL'
        ? refusal('bad_request', `malformed URL ${quote(path)}: a %-escape does not decode`)
        : refusal('bad_request', `malformed request (${error.code})`);
    refuse(reply, r);
  };
}

export function installErrorHandlers(app: FastifyInstance, opts: EdgeErrorOptions): void {
  // Before the answer goes out: once it has, Node dumps the unread rest itself, and a dumped
  // request emits none of it. Reading it here keeps Node from dumping it (it is consumed).
  app.addHook('onSend', (request, _reply, payload, done) => {
    if (bodyLeftUnread(request.raw)) boundUnreadBody(request.raw, opts.maxBodyBytes);
    done(null, payload);
  });
  app.setErrorHandler((error: FastifyError, request, reply) => {
    const r = refusalForError(error, request.headers['content-type'], opts);
    if (r) return opts.refuse(reply, UNKNOWN_MODEL, r);
    app.log.error({ err: error }, 'unhandled error');
    return opts.refuse(reply, UNKNOWN_MODEL, refusal('internal_error', 'internal error'));
  });
  // The methods of each path, for 405. Collected as routes are added, not looked up with
  // hasRoute(): that parses its argument as a route pattern, and a client's path is not one.
  const methods = new Map<string, string[]>();
  app.addHook('onRoute', (route) => {
    const list = methods.get(route.url) ?? [];
    list.push(...[route.method].flat());
    methods.set(route.url, list);
  });
  app.setNotFoundHandler((request, reply) => {
    const path = request.url.split('?', 1)[0]!;
    const allowed = methods.get(path) ?? [];
    if (allowed.length > 0)
      return opts.refuse(
        reply.header('allow', allowed.join(', ')),
        UNKNOWN_MODEL,
        refusal(
          'method_not_allowed',
          `${request.method} is not allowed on ${path}; use ${allowed.join(' or ')}`,
        ),
      );
    return opts.refuse(
      reply,
      UNKNOWN_MODEL,
      refusal('not_found', `no route ${request.method} ${quote(path)}`),
    );
  });
}

/**
 * Fastify's `clientErrorHandler`: Node calls it for errors found before a request reaches
 * Fastify (431, a request not received in time, bytes that are not HTTP). The answer is
 * written on the socket by hand, then the connection ends: the parser cannot go on.
 */
export function clientErrorHandler(
  opts: Pick<EdgeErrorOptions, 'onRefused' | 'requestTimeoutSeconds'>,
): (error: Error & { code?: string }, socket: Socket) => void {
  return (error, socket) => {
    const pending = (socket as Socket & { _httpMessage?: ServerResponse })._httpMessage;
    if (error.code === 'ECONNRESET' || !socket.writable || pending?.headersSent) {
      socket.destroy();
      return;
    }
    const r = refusalForClientError(error, opts.requestTimeoutSeconds);
    opts.onRefused(r);
    const body = refusalBody(r);
    const headers = {
      ...refusalHeaders(r),
      'content-length': String(Buffer.byteLength(body)),
      connection: 'close',
    };
    const head = Object.entries(headers)
      .map(([name, value]) => `${name}: ${value}\r\n`)
      .join('');
    socket.end(`HTTP/1.1 ${r.status} ${STATUS_CODES[r.status] ?? ''}\r\n${head}\r\n${body}`);
    // A client that never reads must not keep the socket: end() waits for the write to drain.
    setTimeout(() => socket.destroy(), 1000).unref();
  };
}

function bodyTooLarge(maxBodyBytes: number): Refusal {
  return refusal('body_too_large', `request body exceeds MAX_BODY_BYTES (${maxBodyBytes} bytes)`);
}

function requestTimeout(seconds: number): Refusal {
  return refusal(
    'request_timeout',
    `request not received within GATEWAY_REQUEST_TIMEOUT_SECONDS (${seconds} s)`,
  );
}

/** A client's string in a message, quoted and cut short. */
function quote(text: string): string {
  return JSON.stringify(text.length > 200 ? `${text.slice(0, 200)}…` : text);
}
