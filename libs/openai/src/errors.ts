/** `ERR_JSON`: the body is not a JSON object. `ERR_FIELD`: a field Sluice reads is missing or mistyped. */
export type RequestPeekErrorCode = 'ERR_JSON' | 'ERR_FIELD';

/**
 * Thrown by `peekRequest` for any body Sluice must refuse with 400. The message is meant for
 * the client, e.g. `invalid JSON at byte 17: expected ':' after an object key` or
 * `max_tokens must be a non-negative integer or null`.
 */
export class RequestPeekError extends Error {
  readonly code: RequestPeekErrorCode;
  /**
   * Byte offset into the body: where the JSON went wrong (`ERR_JSON`), or where the offending
   * value starts (`ERR_FIELD`; undefined when the field is missing).
   */
  readonly offset: number | undefined;
  /** The top-level field at fault (`ERR_FIELD` only), named as in the body: `max_tokens`. */
  readonly field: string | undefined;

  private constructor(
    code: RequestPeekErrorCode,
    message: string,
    offset: number | undefined,
    field: string | undefined,
  ) {
    super(message);
    this.name = 'RequestPeekError';
    this.code = code;
    this.offset = offset;
    this.field = field;
  }

  /** A syntax error (or the nesting limit) at byte `offset`. */
  static json(offset: number, detail: string): RequestPeekError {
    return new RequestPeekError(
      'ERR_JSON',
      `invalid JSON at byte ${offset}: ${detail}`,
      offset,
      undefined,
    );
  }

  /** Well-formed JSON that is not what an OpenAI request must be (not an object). */
  static shape(offset: number, message: string): RequestPeekError {
    return new RequestPeekError('ERR_JSON', message, offset, undefined);
  }

  /** A top-level field that is missing or has the wrong type. */
  static field(field: string, message: string, offset?: number): RequestPeekError {
    return new RequestPeekError('ERR_FIELD', message, offset, field);
  }
}
