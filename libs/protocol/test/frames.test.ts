import { validateHeaderValue } from 'node:http';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import {
  decodeCancel,
  decodeFrame,
  encodeBundle,
  encodeCancel,
  encodeDataFrame,
  encodeFrame,
  frameJobId,
  frameType,
  isHeaderValue,
  messageFrames,
  type Frame,
} from '../src/frames.ts';
import { ProtocolError } from '../src/errors.ts';
import { refusalKinds, type RejectReason } from '../src/reasons.ts';

const jobId = fc.stringMatching(/^[A-Za-z0-9-]{1,40}$/);
const seq = fc.nat({ max: 1_000_000 });
/** What a header may carry: tab, visible ASCII, space and obs-text (Node's rule). */
const headerValue = fc.stringMatching(/^[\t\x20-\x7e\x80-\xff]*$/);
/** A degradation profile's name (libs/config degradation.ts). */
const loadState = fc.stringMatching(/^[a-z0-9][a-z0-9_-]{0,31}$/);

const frame: fc.Arbitrary<Frame> = fc.oneof(
  fc.record({
    type: fc.constant('start' as const),
    jobId,
    seq,
    info: fc.record(
      { engine: headerValue, loadState, sentAfterMs: fc.nat() },
      { requiredKeys: ['engine', 'loadState'] },
    ),
  }),
  fc.record({
    type: fc.constant('head' as const),
    jobId,
    seq,
    info: fc.record({ status: fc.integer({ min: 200, max: 999 }), contentType: headerValue }),
  }),
  fc.record({
    type: fc.constant('data' as const),
    jobId,
    seq,
    chunk: fc.uint8Array({ maxLength: 300 }).map((a) => Buffer.from(a)),
  }),
  fc.record({ type: fc.constant('end' as const), jobId, seq }),
  fc.record({
    type: fc.constant('end' as const),
    jobId,
    seq,
    info: fc.record({ completionTokens: fc.nat(), promptTokens: fc.nat() }, { requiredKeys: [] }),
  }),
  fc.record({ type: fc.constant('alive' as const), jobId, seq }),
  fc.record({
    type: fc.constant('error' as const),
    jobId,
    seq,
    info: fc.record(
      {
        code: fc.constantFrom(...(Object.keys(refusalKinds) as RejectReason[])),
        message: fc.string({ unit: 'grapheme' }),
        retryAfter: fc.nat({ max: 3600 }),
      },
      { requiredKeys: ['code', 'message'] },
    ),
  }),
);

describe('reply frames', () => {
  it('decode(encode(frame)) is the frame, for every frame type', () => {
    fc.assert(
      fc.property(frame, (f) => {
        const decoded = decodeFrame(encodeFrame(f));
        expect(decoded).toEqual(f);
        expect(frameJobId(encodeFrame(f))).toBe(f.jobId);
        expect(frameType(encodeFrame(f))).toBe(f.type);
      }),
    );
  });

  it('carries data bytes verbatim, including newlines and non-UTF-8 bytes', () => {
    const chunk = Buffer.from([0x64, 0x61, 0x0a, 0x0a, 0xff, 0x00, 0x20]);
    const decoded = decodeFrame(encodeFrame({ type: 'data', jobId: 'j1', seq: 7, chunk }));
    expect(decoded.type === 'data' && Buffer.compare(decoded.chunk, chunk)).toBe(0);
  });

  it('joins several chunks into one data frame', () => {
    const decoded = decodeFrame(
      encodeDataFrame('j', 3, [Buffer.from('data: a\n\n'), Buffer.from('data: b\n\n')]),
    );
    expect(decoded).toEqual({
      type: 'data',
      jobId: 'j',
      seq: 3,
      chunk: Buffer.from('data: a\n\ndata: b\n\n'),
    });
  });

  it.each([
    ['an unknown type', 'Qjob 1\n', /unknown frame type "Q"/],
    ['a missing sequence number', 'Ejob\n', /header must be/],
    ['a non-numeric sequence number', 'Ejob 1x\n', /not a decimal integer/],
    ['a head frame that is not JSON', 'Hjob 0\n{oops', /head frame payload is not JSON/],
    [
      'a head frame without status',
      'Hjob 0\n{"contentType":"x"}',
      /field status must be an integer from 200 to 999/,
    ],
    // What the reviewer published: Node's writeHead throws on it (ERR_HTTP_INVALID_STATUS_CODE).
    [
      'a head frame with a status over 999',
      'Hjob 0\n{"status":1000,"contentType":"application/json"}',
      /field status must be an integer from 200 to 999/,
    ],
    [
      'a head frame with an informational status',
      'Hjob 0\n{"status":101,"contentType":"application/json"}',
      /field status must be an integer from 200 to 999/,
    ],
    [
      'a head frame with a fractional status',
      'Hjob 0\n{"status":200.5,"contentType":"application/json"}',
      /field status must be an integer from 200 to 999/,
    ],
    [
      'a head frame whose content type would end its header',
      'Hjob 0\n{"status":200,"contentType":"text/plain\\r\\nset-cookie: a=b"}',
      /field contentType must be a string a header can carry/,
    ],
    [
      'a head frame whose content type has a character past latin-1',
      'Hjob 0\n{"status":200,"contentType":"text/\u4e2d"}',
      /field contentType must be a string a header can carry/,
    ],
    [
      'a start frame whose engine name has a newline',
      'Sjob 0\n{"engine":"e\\nx-injected: 1","loadState":"normal"}',
      /field engine must be a string a header can carry/,
    ],
    [
      'a start frame whose load state would inject an event',
      'Sjob 0\n{"engine":"e","loadState":"normal\\n\\ndata: {\\"injected\\":1}"}',
      /field loadState must be a degradation profile name/,
    ],
    [
      'a start frame whose load state is not a profile name',
      'Sjob 0\n{"engine":"e","loadState":"Normal state"}',
      /field loadState must be a degradation profile name/,
    ],
    [
      'an error frame with an infinite Retry-After',
      'Xjob 0\n{"code":"queue_full","message":"m","retryAfter":1e999}',
      /retryAfter must be a non-negative number/,
    ],
    ['an alive frame with a payload', 'Ajob 2\nextra', /carries no payload/],
    ['an end frame whose payload is not JSON', 'Ejob 2\nextra', /end frame payload is not JSON/],
    [
      'an end frame with a negative token count',
      'Ejob 2\n{"completionTokens":-3}',
      /completionTokens must be a non-negative integer/,
    ],
    [
      'an end frame with a fractional token count',
      'Ejob 2\n{"promptTokens":1.5}',
      /promptTokens must be a non-negative integer/,
    ],
    [
      'an end frame with a token count that is not a number',
      'Ejob 2\n{"promptTokens":"7"}',
      /promptTokens must be a non-negative integer/,
    ],
    [
      'a start frame sent a negative time after its release',
      'Sjob 0\n{"engine":"e","loadState":"normal","sentAfterMs":-1}',
      /sentAfterMs must be a non-negative number/,
    ],
    ['an empty message', '', /unknown frame type/],
  ])('rejects %s with a ProtocolError', (_name, text, message) => {
    expect(() => decodeFrame(Buffer.from(text))).toThrow(ProtocolError);
    expect(() => decodeFrame(Buffer.from(text))).toThrow(message);
  });

  it('decodes only head and start frames whose every field the gateway can write as a header', () => {
    // Any JSON value where a field goes: whatever decodes, Node's writeHead takes.
    const anyValue = fc.oneof(
      fc.string({ unit: 'binary' }),
      headerValue,
      loadState,
      fc.integer({ min: -10, max: 2000 }),
      fc.double(),
      fc.constant(null),
    );
    fc.assert(
      fc.property(fc.constantFrom('H', 'S'), anyValue, anyValue, (letter, a, b) => {
        const info = letter === 'H' ? { status: a, contentType: b } : { engine: a, loadState: b };
        let frame: Frame;
        try {
          frame = decodeFrame(Buffer.from(`${letter}job 0\n${JSON.stringify(info)}`));
        } catch (err) {
          expect(err).toBeInstanceOf(ProtocolError);
          return;
        }
        if (frame.type === 'head') {
          expect(frame.info.status).toBeGreaterThanOrEqual(100);
          expect(frame.info.status).toBeLessThanOrEqual(999);
          expect(Number.isInteger(frame.info.status)).toBe(true);
          expect(() => validateHeaderValue('content-type', frame.info.contentType)).not.toThrow();
        } else if (frame.type === 'start') {
          expect(() => validateHeaderValue('x-sluice-engine', frame.info.engine)).not.toThrow();
          expect(() =>
            validateHeaderValue('x-sluice-load-state', frame.info.loadState),
          ).not.toThrow();
          expect(frame.info.loadState).not.toMatch(/[\r\n]/);
        }
      }),
    );
  });

  it('takes as a header value exactly what Node takes', () => {
    fc.assert(
      fc.property(fc.string({ unit: 'binary', maxLength: 8 }), (value) => {
        let nodeTakes = true;
        try {
          validateHeaderValue('x', value);
        } catch {
          nodeTakes = false;
        }
        expect(isHeaderValue(value)).toBe(nodeTakes);
      }),
    );
  });

  it('never throws anything but ProtocolError on arbitrary bytes', () => {
    fc.assert(
      fc.property(fc.uint8Array({ maxLength: 64 }), (bytes) => {
        try {
          decodeFrame(Buffer.from(bytes));
        } catch (err) {
          expect(err).toBeInstanceOf(ProtocolError);
        }
      }),
    );
  });

  it('bundles frames into one message and gives them back in order, byte for byte', () => {
    fc.assert(
      fc.property(fc.array(frame, { minLength: 2, maxLength: 20 }), (frames) => {
        const bundle = encodeBundle(frames.map(encodeFrame));
        expect(messageFrames(bundle).map(decodeFrame)).toEqual(frames);
      }),
    );
  });

  it("reads an end frame without a payload (a previous dispatcher's) as one without counts", () => {
    expect(decodeFrame(Buffer.from('Ejob 5\n'))).toEqual({ type: 'end', jobId: 'job', seq: 5 });
  });

  it('reads a plain frame as a message of one frame', () => {
    const message = encodeFrame({ type: 'end', jobId: 'j', seq: 4 });
    expect(messageFrames(message)).toEqual([message]);
  });

  it.each([
    ['a bundle with no frame', Buffer.from('B'), /carries no frame/],
    ['a truncated length', Buffer.from([0x42, 0, 0, 1]), /truncated/],
    ['a length past the end', Buffer.from([0x42, 0, 0, 0, 9, 0x45]), /does not fit/],
    ['a frame of length zero', Buffer.from([0x42, 0, 0, 0, 0]), /does not fit/],
  ])('refuses %s whole with a ProtocolError', (_name, bytes, message) => {
    expect(() => messageFrames(bytes)).toThrow(ProtocolError);
    expect(() => messageFrames(bytes)).toThrow(message);
  });

  it('never throws anything but ProtocolError on an arbitrary bundle', () => {
    fc.assert(
      fc.property(fc.uint8Array({ maxLength: 64 }), (bytes) => {
        try {
          messageFrames(Buffer.concat([Buffer.from('B'), Buffer.from(bytes)]));
        } catch (err) {
          expect(err).toBeInstanceOf(ProtocolError);
        }
      }),
    );
  });

  it('encodes cancel requests as <jobId> <reason>', () => {
    expect(decodeCancel(encodeCancel('abc', 'client gone'))).toEqual({
      jobId: 'abc',
      reason: 'client gone',
    });
    expect(() => decodeCancel('nospace')).toThrow(ProtocolError);
  });
});
