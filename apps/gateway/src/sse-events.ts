// An event stream as the gateway may write it: whole events only. The dispatcher relays the
// engine's chunks as TCP cut them, so a chunk can stop in the middle of an event; an in-band
// error written after such a chunk would be glued to half an event, which OpenAI SDKs fail
// to parse instead of raising the error.
const LF_EVENT_END = Buffer.from('\n\n');
// The SSE spec allows CRLF line ends; an engine behind a proxy may use them.
const CRLF_EVENT_END = Buffer.from('\r\n\r\n');
const NOTHING = Buffer.alloc(0);

/**
 * Where the last complete event in `bytes` ends (just past its blank line), or -1. A CRLF end
 * later than the last LF one can only start past it, so the second search reads only that part:
 * each byte of a chunk is read at most twice, and a chunk that ends an event (the usual token)
 * is answered from its last bytes.
 */
function lastEventEnd(bytes: Buffer): number {
  const lf = bytes.lastIndexOf(LF_EVENT_END);
  const from = lf < 0 ? 0 : lf + LF_EVENT_END.length;
  if (lf >= 0 && from === bytes.length) return from;
  const crlf = bytes.subarray(from).lastIndexOf(CRLF_EVENT_END);
  if (crlf >= 0) return from + crlf + CRLF_EVENT_END.length;
  return lf < 0 ? -1 : from;
}

/**
 * The bytes of an event stream that may go to the client: up to the end of its last complete
 * event. The dispatcher relays the engine's chunks as TCP cut them, so a chunk can stop in
 * the middle of an event; that tail is held until a later chunk completes it. Only the new
 * chunk (and the last bytes held) is searched, never what went out: this runs per token.
 */
export class SseEvents {
  private held: Buffer[] = [];
  private heldBytes = 0;
  /** The last three bytes held: a blank line begun there ends in the next chunk. */
  private heldEnd = NOTHING;

  /**
   * `maxHeld`: a stream that goes this long without completing an event is let out as it
   * comes, so that a body with no blank line (not really an event stream) cannot grow here
   * unbounded; only an error after it may then land mid-event.
   */
  constructor(private readonly maxHeld: number) {}

  /** What of `chunk`, after what was held, may go out; undefined while nothing may. */
  complete(chunk: Buffer): Buffer | undefined {
    const inChunk = lastEventEnd(chunk);
    const end = inChunk >= 0 ? inChunk : this.seamEnd(chunk);
    if (end < 0) {
      this.hold(chunk);
      return this.heldBytes > this.maxHeld ? this.rest() : undefined;
    }
    const head = end === chunk.length ? chunk : chunk.subarray(0, end);
    const whole = this.held.length === 0 ? head : Buffer.concat([...this.held, head]);
    this.clear();
    if (end < chunk.length) this.hold(chunk.subarray(end));
    return whole;
  }

  /** Everything held, given up: the stream ended. */
  rest(): Buffer | undefined {
    if (this.held.length === 0) return undefined;
    const rest = Buffer.concat(this.held);
    this.clear();
    return rest;
  }

  /**
   * An event end whose blank line began in the held bytes: at most three bytes of it lie in
   * `chunk`. Any later end would have been found in `chunk` alone.
   */
  private seamEnd(chunk: Buffer): number {
    if (this.heldEnd.length === 0) return -1;
    const end = lastEventEnd(Buffer.concat([this.heldEnd, chunk.subarray(0, 3)]));
    return end > this.heldEnd.length ? end - this.heldEnd.length : -1;
  }

  private hold(bytes: Buffer): void {
    // A copy: a view would keep the whole pub/sub message (a bundle of many requests' frames)
    // alive while the tail waits.
    this.held.push(Buffer.from(bytes));
    this.heldBytes += bytes.length;
    this.heldEnd = Buffer.concat([this.heldEnd, bytes.subarray(-3)]).subarray(-3);
  }

  private clear(): void {
    this.held = [];
    this.heldBytes = 0;
    this.heldEnd = NOTHING;
  }
}
