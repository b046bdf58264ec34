// SseEvents: what of a cut event stream may go to the client, against the slow way of finding
// the last complete event.
import { describe, expect, it } from 'vitest';
import { SseEvents } from '../src/sse-events.ts';

describe('SseEvents', () => {
  // LF and CRLF events, a comment, and an incomplete last event.
  const stream = 'data: {"a":1}\n\ndata: {"b":2}\r\n\r\n: keep\n\ndata: {"c":3}\r\n\r\ndata: x';

  /** Where the last complete event of `fed` ends, found the slow way. */
  function expectedEnd(fed: string): number {
    const lf = fed.lastIndexOf('\n\n');
    const crlf = fed.lastIndexOf('\r\n\r\n');
    return Math.max(lf < 0 ? 0 : lf + 2, crlf < 0 ? 0 : crlf + 4);
  }

  /** Feeds `pieces`; after each, what went out must be exactly the complete events fed. */
  function feed(pieces: string[]): void {
    const events = new SseEvents(1024);
    let out = '';
    let fed = '';
    for (const piece of pieces) {
      out += events.complete(Buffer.from(piece))?.toString() ?? '';
      fed += piece;
      expect(out).toBe(fed.slice(0, expectedEnd(fed)));
    }
    expect(out + (events.rest()?.toString() ?? '')).toBe(fed);
  }

  it('lets out complete events only, wherever the stream is cut in two or three', () => {
    for (let i = 0; i <= stream.length; i += 1)
      for (let j = i; j <= stream.length; j += 1)
        feed([stream.slice(0, i), stream.slice(i, j), stream.slice(j)]);
  });

  it('finds a blank line spread over several one-byte chunks', () => {
    feed([...stream]);
  });

  it('lets out a stream that goes on past its bound without completing an event', () => {
    const events = new SseEvents(8);
    expect(events.complete(Buffer.from('data: '))).toBeUndefined();
    expect(events.complete(Buffer.from('abc'))?.toString()).toBe('data: abc');
    expect(events.complete(Buffer.from('def\n\ndata: '))?.toString()).toBe('def\n\n');
    expect(events.rest()?.toString()).toBe('data: ');
  });
});
