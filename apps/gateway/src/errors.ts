// Errors that reach Fastify's error handler, mapped to refusals from the table: a client
// never sees Fastify's own error shape, and only a bug answers 500.
import type { FastifyError, FastifyInstance, FastifyReply } from 'fastify';
import { refusal, type Refusal } from './refuse.js';

export interface ErrorHandlerOptions {
  maxBodyBytes: number;
  refuse(reply: FastifyReply, model: string, r: Refusal): FastifyReply;
}

/** The refusal for an error, or undefined when it is a bug (answered 500 and logged). */
export function refusalForError(
  error: Pick<FastifyError, 'code' | 'message'> & { statusCode?: number },
  contentType: string | undefined,
  maxBodyBytes: number,
): Refusal | undefined {
  if (error.code === 'FST_ERR_CTP_BODY_TOO_LARGE')
    return refusal('body_too_large', `request body exceeds MAX_BODY_BYTES (${maxBodyBytes} bytes)`);
  if (error.code === 'FST_ERR_CTP_INVALID_MEDIA_TYPE')
    return refusal(
      'unsupported_media_type',
      `content-type must be application/json, got ${JSON.stringify(contentType ?? '')}`,
    );
  if (error.code === 'FST_ERR_CTP_EMPTY_JSON_BODY')
    return refusal('bad_request', 'request body is empty');
  if (error.statusCode && error.statusCode >= 400 && error.statusCode < 500)
    return refusal('bad_request', error.message);
  return undefined;
}

export function installErrorHandler(app: FastifyInstance, opts: ErrorHandlerOptions): void {
  app.setErrorHandler((error: FastifyError, request, reply) => {
    const r = refusalForError(error, request.headers['content-type'], opts.maxBodyBytes);
    if (r) return opts.refuse(reply, '', r);
    app.log.error({ err: error }, 'unhandled error');
    return opts.refuse(reply, '', refusal('internal_error', 'internal error'));
  });
}
