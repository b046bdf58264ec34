// x-request-id: the id a client (or its proxy) sent is kept when it is safe to log and to echo,
// else the gateway makes one. Either way it is Fastify's `request.id` (so every line logged
// for the request carries it as `reqId`), every answer carries it back, the access log names
// the request by it, and the engine gets it (vLLM names the completion after it).
//
// Beside it, what else of the client's request vLLM reads from its headers: the W3C trace
// context (`traceparent`, `tracestate`) and `x-data-parallel-rank`. They are untrusted: each is
// kept only when well-formed (the rules are @sluice/protocol's, which the dispatcher checks
// again), else dropped; none is ever a reason to refuse the request.
import { randomUUID } from 'node:crypto';
import type { IncomingHttpHeaders } from 'node:http';
import {
  engineRequestHeaders,
  isDataParallelRank,
  isRequestId,
  isTraceparent,
  isTracestate,
} from '@sluice/protocol';
import type { FastifyInstance } from 'fastify';

export const REQUEST_ID_HEADER = engineRequestHeaders.requestId;

export { MAX_REQUEST_ID_LENGTH } from '@sluice/protocol';

declare module 'fastify' {
  interface FastifyRequest {
    /** When the request's headers had arrived (the onRequest hook), by the gateway's clock. */
    arrivedAt: number;
  }
}

/** The request's id: the header's value when it is one, else a new UUID. */
export function requestId(header: string | string[] | undefined): string {
  return isRequestId(header) ? header : randomUUID();
}

/**
 * The client's trace context and data-parallel rank as the engine is to get them: each header
 * when well-formed, else undefined. Two `traceparent` headers arrive joined (", ") and so are
 * dropped, as W3C asks; a `tracestate` goes only with a `traceparent` (W3C: without one it
 * must not be used).
 */
export function traceparentOf(headers: IncomingHttpHeaders): string | undefined {
  const value = headers[engineRequestHeaders.traceparent];
  return isTraceparent(value) ? value : undefined;
}

/** The client's `tracestate` when well-formed; call it only when `traceparentOf` gave one. */
export function tracestateOf(headers: IncomingHttpHeaders): string | undefined {
  const value = headers[engineRequestHeaders.tracestate];
  return isTracestate(value) ? value : undefined;
}

/** The client's `x-data-parallel-rank` when it is a non-negative integer. */
export function dataParallelRankOf(headers: IncomingHttpHeaders): string | undefined {
  const value = headers[engineRequestHeaders.dataParallelRank];
  return isDataParallelRank(value) ? value : undefined;
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
