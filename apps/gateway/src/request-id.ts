// x-request-id: the id a client (or its proxy) sent is kept when it is safe to log and to echo,
// else the gateway makes one. Either way it is Fastify's `request.id` (so every line logged
// for the request carries it as `reqId`), every answer carries it back, and the access log
// names the request by it.
import { randomUUID } from 'node:crypto';
import type { FastifyInstance } from 'fastify';

export const REQUEST_ID_HEADER = 'x-request-id';

/** Longest id kept: a UUID, a ULID or a W3C trace id fit with room to spare. */
export const MAX_REQUEST_ID_LENGTH = 128;

// Letters, digits and `.`, `_`, `-`, `:`: nothing a log reader or a header could misread.
const SAFE_ID = new RegExp(`^[A-Za-z0-9._:-]{1,${MAX_REQUEST_ID_LENGTH}}$`);

declare module 'fastify' {
  interface FastifyRequest {
    /** When the request's headers had arrived (the onRequest hook), by the gateway's clock. */
    arrivedAt: number;
  }
}

/** The request's id: the header's value when it is one, else a new UUID. */
export function requestId(header: string | string[] | undefined): string {
  return typeof header === 'string' && SAFE_ID.test(header) ? header : randomUUID();
}

/**
 * Stamps every request with its arrival time and every answer with `x-request-id`: set on the
 * raw response, so answers written by hand (held streams, refusals, pass-through) carry it as
 * well as Fastify's. Register it before any other onRequest hook (the key check answers from
 * one).
 */
export function installRequestId(app: FastifyInstance, now: () => number): void {
  app.decorateRequest('arrivedAt', 0);
  app.addHook('onRequest', (request, reply, done) => {
    request.arrivedAt = now();
    reply.raw.setHeader(REQUEST_ID_HEADER, request.id);
    done();
  });
}
