// Reply frames: dispatcher -> gateway replica, over that replica's pub/sub channel.
//
// Wire form (bytes): a pub/sub message is one frame,
//   <type><jobId> <seq>\n<payload>
// or a bundle of the frames one dispatcher had for one replica in one turn of its event loop,
//   B(<uint32 big-endian length><frame>)+
// so a busy relay costs one PUBLISH per replica and turn, not one per frame.
// `type` is one ASCII letter; `seq` counts 0, 1, 2... per job so a lost frame shows up as a
// gap. Payloads: `data` carries the engine's bytes verbatim (never parsed on the way);
// `start`, `head` and `error` carry a small JSON object; `end` carries one only when it has
// token counts (a dispatcher of the previous version sends none); `alive` carries nothing.
// The header is ASCII, so the gateway finds the payload without decoding it.
import { ProtocolError } from './errors.js';
import { isRejectReason, type RejectReason } from './reasons.js';

export type FrameType = 'start' | 'head' | 'data' | 'end' | 'error' | 'alive';

export interface StartInfo {
  /** Engine the job was released to. */
  engine: string;
  /** Load state that applied at release (degradation; 'normal' until then). */
  loadState: string;
  /**
   * Milliseconds between the release and this frame's sending: the start travels with the
   * engine's head (or the liveness tick), and the gateway takes this off its queue wait.
   */
  sentAfterMs?: number;
}

export interface HeadInfo {
  status: number;
  contentType: string;
}

/**
 * What the dispatcher learnt of the answer's tokens from the bytes it relayed (it never parses
 * the body: see the dispatcher's output-tokens.ts). Absent fields are unknown.
 */
export interface EndInfo {
  /** The engine's `usage.completion_tokens`, else one per streamed SSE event (an estimate). */
  completionTokens?: number;
  /** The engine's `usage.prompt_tokens`; absent when the engine sent no usage. */
  promptTokens?: number;
}

/**
 * A count of tokens as Sluice carries and charges it: an integer JSON and a double hold
 * exactly. The gateway refuses an end frame with any other; the dispatcher ignores an engine's
 * `usage` count that is not one rather than send it (output-tokens.ts).
 */
export function isTokenCount(n: unknown): n is number {
  return Number.isSafeInteger(n) && (n as number) >= 0;
}

export interface ErrorInfo {
  /** Why the request ended; its status and OpenAI type come from the refusal table. */
  code: RejectReason;
  message: string;
  /** `Retry-After` seconds, when the sender knows better than the table's default. */
  retryAfter?: number;
}

export type Frame =
  | { type: 'start'; jobId: string; seq: number; info: StartInfo }
  | { type: 'head'; jobId: string; seq: number; info: HeadInfo }
  | { type: 'data'; jobId: string; seq: number; chunk: Buffer }
  | { type: 'end'; jobId: string; seq: number; info?: EndInfo }
  | { type: 'error'; jobId: string; seq: number; info: ErrorInfo }
  | { type: 'alive'; jobId: string; seq: number };

const letters: Record<FrameType, string> = {
  start: 'S',
  head: 'H',
  data: 'D',
  end: 'E',
  error: 'X',
  alive: 'A',
};
const types: Record<number, FrameType> = {};
for (const [type, letter] of Object.entries(letters))
  types[letter.charCodeAt(0)] = type as FrameType;

const NEWLINE = 0x0a;
const SPACE = 0x20;

function header(type: FrameType, jobId: string, seq: number): string {
  return `${letters[type]}${jobId} ${seq}\n`;
}

export function encodeFrame(frame: Frame): Buffer {
  const head = header(frame.type, frame.jobId, frame.seq);
  switch (frame.type) {
    case 'data':
      return Buffer.concat([Buffer.from(head, 'latin1'), frame.chunk]);
    case 'start':
    case 'head':
    case 'error':
      return Buffer.from(head + JSON.stringify(frame.info), 'utf8');
    case 'end':
      return Buffer.from(frame.info ? head + JSON.stringify(frame.info) : head, 'latin1');
    default:
      return Buffer.from(head, 'latin1');
  }
}

/** Encodes a data frame from several chunks without concatenating them first. */
export function encodeDataFrame(jobId: string, seq: number, chunks: readonly Buffer[]): Buffer {
  return Buffer.concat([Buffer.from(header('data', jobId, seq), 'latin1'), ...chunks]);
}

/**
 * The statuses a head frame may carry: what the dispatcher relays (an engine's final status; it
 * drops a 1xx, whose real head follows), within the 100-999 Node's `writeHead` accepts.
 */
export function isHeadStatus(value: unknown): value is number {
  return Number.isInteger(value) && (value as number) >= 200 && (value as number) <= 999;
}

// Node's own rule for a header value (lib/_http_common.js checkInvalidHeaderChar): tab, and
// visible ASCII, space and obs-text; no CR, LF or other control character. `writeHead` throws
// on anything else, and a CR or LF would end the header.
const HEADER_VALUE = /^[\t\x20-\x7e\x80-\xff]*$/;

/** A string a response header may carry as it is (the engine's `content-type`, its name). */
export function isHeaderValue(value: unknown): value is string {
  return typeof value === 'string' && HEADER_VALUE.test(value);
}

// A degradation profile's name, as libs/config (degradation.ts, `profileName`) lets one be
// configured: the only load states a dispatcher sends. Written into a header and into an
// event stream's comment line: nothing else is safe there.
const LOAD_STATE = /^[a-z0-9][a-z0-9_-]{0,31}$/;

/** A load state as a start frame may name it: a degradation profile's name. */
export function isLoadState(value: unknown): value is string {
  return typeof value === 'string' && LOAD_STATE.test(value);
}

const isString = (value: unknown): value is string => typeof value === 'string';

/** What the gateway writes each field of a payload into decides what it must be. */
const infoFields: Partial<
  Record<FrameType, ReadonlyArray<readonly [string, (value: unknown) => boolean, string]>>
> = {
  start: [
    ['engine', isHeaderValue, 'a string a header can carry'],
    ['loadState', isLoadState, 'a degradation profile name'],
  ],
  head: [
    ['status', isHeadStatus, 'an integer from 200 to 999'],
    ['contentType', isHeaderValue, 'a string a header can carry'],
  ],
  error: [
    ['code', isString, 'a string'],
    ['message', isString, 'a string'],
  ],
};

function parseInfo(type: FrameType, payload: Buffer): unknown {
  let info: unknown;
  try {
    info = JSON.parse(payload.toString('utf8'));
  } catch {
    throw new ProtocolError(`${type} frame payload is not JSON`);
  }
  if (typeof info !== 'object' || info === null)
    throw new ProtocolError(`${type} frame payload is not an object`);
  const o = info as Record<string, unknown>;
  for (const [field, valid, expected] of infoFields[type] ?? [])
    if (!valid(o[field]))
      throw new ProtocolError(`${type} frame field ${field} must be ${expected}`);
  return info;
}

/** Reads the frame's type alone, from its first byte: undefined when it names none. */
export function frameType(message: Buffer): FrameType | undefined {
  return types[message[0] ?? -1];
}

/** Reads the job id alone, cheaply: lets a gateway route or drop a frame before decoding it. */
export function frameJobId(message: Buffer): string | undefined {
  const space = message.indexOf(SPACE);
  return space > 1 ? message.toString('latin1', 1, space) : undefined;
}

/**
 * An error frame's reason as this side knows it. A newer dispatcher may end a job with a
 * reason this gateway's table lacks (`engine_timeout`, December 2026), mid-rollout: the client
 * still gets the error and its message, as `internal_error`, with the code named, instead of
 * the whole frame being dropped as unreadable. A code that is not a plain name is not repeated.
 */
function knownReason(info: ErrorInfo): ErrorInfo {
  if (isRejectReason(info.code)) return info;
  const named = /^[a-z_]{1,64}$/.test(info.code) ? ` (${info.code}, unknown to this gateway)` : '';
  return { ...info, code: 'internal_error', message: `${info.message}${named}` };
}

export function decodeFrame(message: Buffer): Frame {
  const type = types[message[0] ?? -1];
  if (type === undefined)
    throw new ProtocolError(
      `unknown frame type ${JSON.stringify(String.fromCharCode(message[0] ?? 0))}`,
    );
  const space = message.indexOf(SPACE);
  const newline = message.indexOf(NEWLINE);
  if (space < 2 || newline < space + 2)
    throw new ProtocolError('frame header must be <type><jobId> <seq>\\n');
  const jobId = message.toString('latin1', 1, space);
  let seq = 0;
  for (let i = space + 1; i < newline; i += 1) {
    const digit = message[i]! - 0x30;
    if (digit < 0 || digit > 9)
      throw new ProtocolError(`frame sequence number of job ${jobId} is not a decimal integer`);
    seq = seq * 10 + digit;
  }
  const payload = message.subarray(newline + 1);
  switch (type) {
    case 'data':
      return { type, jobId, seq, chunk: payload };
    case 'start': {
      const info = parseInfo(type, payload) as StartInfo;
      const after = info.sentAfterMs;
      if (after !== undefined && !(typeof after === 'number' && after >= 0 && after < Infinity))
        throw new ProtocolError('start frame field sentAfterMs must be a non-negative number');
      return { type, jobId, seq, info };
    }
    case 'head':
      return { type, jobId, seq, info: parseInfo(type, payload) as HeadInfo };
    case 'error': {
      const info = knownReason(parseInfo(type, payload) as ErrorInfo);
      // Written as `Retry-After`: JSON's 1e999 parses to Infinity.
      if (
        info.retryAfter !== undefined &&
        !(typeof info.retryAfter === 'number' && info.retryAfter >= 0 && info.retryAfter < Infinity)
      )
        throw new ProtocolError('error frame field retryAfter must be a non-negative number');
      return { type, jobId, seq, info };
    }
    case 'end': {
      if (payload.length === 0) return { type, jobId, seq };
      const info = parseInfo(type, payload) as EndInfo;
      for (const field of ['completionTokens', 'promptTokens'] as const) {
        const n = info[field];
        if (n !== undefined && !isTokenCount(n))
          throw new ProtocolError(`end frame field ${field} must be a non-negative integer`);
      }
      return { type, jobId, seq, info };
    }
    default:
      if (payload.length > 0) throw new ProtocolError(`${type} frame carries no payload`);
      return { type, jobId, seq };
  }
}

const BUNDLE = 0x42; // 'B'

/** Bundles frames already encoded into one message (at least two; one goes as it is). */
export function encodeBundle(frames: readonly Buffer[]): Buffer {
  let size = 1;
  for (const f of frames) size += 4 + f.length;
  const out = Buffer.allocUnsafe(size);
  out[0] = BUNDLE;
  let at = 1;
  for (const f of frames) {
    out.writeUInt32BE(f.length, at);
    f.copy(out, at + 4);
    at += 4 + f.length;
  }
  return out;
}

/**
 * The frames of one pub/sub message: itself if it is a frame, the frames it carries if it is a
 * bundle (views into the message, not copies). A bundle whose lengths do not add up to its
 * size is refused whole: no frame of it can be trusted.
 */
export function messageFrames(message: Buffer): Buffer[] {
  if (message[0] !== BUNDLE) return [message];
  const frames: Buffer[] = [];
  let at = 1;
  while (at < message.length) {
    if (at + 4 > message.length)
      throw new ProtocolError(`bundle truncated: ${message.length - at} bytes left, not a length`);
    const length = message.readUInt32BE(at);
    if (length === 0 || at + 4 + length > message.length)
      throw new ProtocolError(
        `bundle frame of ${length} bytes at offset ${at} does not fit in ${message.length} bytes`,
      );
    frames.push(message.subarray(at + 4, at + 4 + length));
    at += 4 + length;
  }
  if (frames.length === 0) throw new ProtocolError('bundle carries no frame');
  return frames;
}

/** Cancel requests on the cancel channel: `<jobId> <reason>`. */
export function encodeCancel(jobId: string, reason: string): string {
  return `${jobId} ${reason}`;
}

export function decodeCancel(message: string): { jobId: string; reason: string } {
  const space = message.indexOf(' ');
  if (space < 1) throw new ProtocolError('cancel message must be <jobId> <reason>');
  return { jobId: message.slice(0, space), reason: message.slice(space + 1) };
}
