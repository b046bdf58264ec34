/** A payload or frame that does not follow the wire format. Nothing in it is trusted. */
export class ProtocolError extends Error {
  readonly code = 'ERR_SLUICE_PROTOCOL';
}
