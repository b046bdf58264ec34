import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import {
  BULL_MAX_PRIORITY,
  bullPriority,
  engineRequestHeaders,
  isDataParallelRank,
  isRequestId,
  isTraceparent,
  isTracestate,
  jobBody,
  MAX_TRACESTATE_LENGTH,
  validateJobPayload,
  type JobPayload,
} from '../src/job.ts';
import { keySpace } from '../src/keys.ts';

const valid: JobPayload = {
  v: 1,
  body: '{"model":"m"}',
  path: '/v1/chat/completions',
  stream: true,
  replica: 'gw-1',
  enqueuedAt: 1,
  deadline: 2,
  priority: 0,
};

describe('job payload', () => {
  it('accepts a well-formed payload unchanged', () => {
    expect(validateJobPayload(valid)).toBe(valid);
    expect(validateJobPayload({ ...valid, maxTokens: 10, tenant: 't', sequences: 8 })).toEqual({
      ...valid,
      maxTokens: 10,
      tenant: 't',
      sequences: 8,
    });
  });

  it.each([
    [null, /\(root\) must be an object/],
    [{ ...valid, v: 2 }, /field v must be 1/],
    [{ ...valid, body: 3 }, /field body must be a string/],
    [
      { ...valid, bodyBase64: 'e30=' },
      /field body must be a string, or absent beside a bodyBase64/,
    ],
    [{ ...valid, body: undefined }, /field body must be a string, or absent beside a bodyBase64/],
    [{ ...valid, body: undefined, bodyBase64: 7 }, /field bodyBase64 must be a string/],
    [{ ...valid, bodyInKey: true }, /field body must be a string, or absent beside .* bodyInKey/],
    [{ ...valid, body: undefined, bodyInKey: 1 }, /field bodyInKey must be true/],
    [
      { ...valid, path: '/v1/embeddings' },
      /field path must be \/v1\/chat\/completions or \/v1\/completions/,
    ],
    [{ ...valid, stream: 'yes' }, /field stream must be a boolean/],
    [{ ...valid, replica: '' }, /field replica must be a non-empty string/],
    [
      { ...valid, replica: 'gw 1' },
      /field replica must be a non-empty string of letters, .*"gw 1"/,
    ],
    [{ ...valid, replica: 'gw:1' }, /field replica must be/],
    [{ ...valid, deadline: 'soon' }, /field deadline must be a number/],
    [{ ...valid, priority: -1 }, /field priority must be an integer >= 0/],
    [{ ...valid, maxTokens: 1.5 }, /field maxTokens must be an integer >= 0/],
    [{ ...valid, optOut: 'yes' }, /field optOut must be a boolean/],
    [{ ...valid, sequences: 0 }, /field sequences must be an integer >= 1/],
    [{ ...valid, sequences: 2.5 }, /field sequences must be an integer >= 1/],
    [{ ...valid, sequences: '4' }, /field sequences must be an integer >= 1/],
    [{ ...valid, endCounts: 1 }, /field endCounts must be a boolean/],
  ])('refuses %j naming the field', (payload, message) => {
    expect(() => validateJobPayload(payload)).toThrow(message);
  });

  it('carries the body as text or as base64, and gives the same bytes back either way', () => {
    const bytes = Buffer.from('{"model":"m","messages":[{"content":"caf\u00e9 \\"q\\" \u4e2d"}]}');
    const asBase64 = { ...valid, body: undefined, bodyBase64: bytes.toString('base64') };
    expect(validateJobPayload(asBase64)).toBe(asBase64);
    expect(Buffer.from(jobBody(asBase64))).toEqual(bytes);
    expect(Buffer.from(jobBody({ ...valid, body: bytes.toString('utf8') }))).toEqual(bytes);
  });

  it('accepts a body carried in a key of its own instead of the payload', () => {
    const inKey = { ...valid, body: undefined, bodyInKey: true };
    expect(validateJobPayload(inKey)).toBe(inKey);
  });

  it('maps priority classes to BullMQ priorities, aged long before short before long within a class', () => {
    expect(bullPriority(10, 10, 'aged')).toBe(1);
    expect(bullPriority(10, 10, 'short')).toBe(2);
    expect(bullPriority(10, 10, 'long')).toBe(3);
    expect(bullPriority(9, 10, 'aged')).toBe(4);
    expect(bullPriority(0, 10, 'long')).toBe(33);
    // A higher class goes first whatever the level.
    expect(bullPriority(5, 10, 'long')).toBeLessThan(bullPriority(4, 10, 'aged'));
    // Values above the maximum are clamped to it; the highest maximum fits BullMQ's range.
    expect(bullPriority(99, 10, 'short')).toBe(2);
    expect(bullPriority(0, 699_049, 'long')).toBeLessThanOrEqual(BULL_MAX_PRIORITY);
  });

  it('reads the prompt-token estimate and refuses a bad one', () => {
    expect(validateJobPayload({ ...valid, promptTokens: 65_536 }).promptTokens).toBe(65_536);
    expect(() => validateJobPayload({ ...valid, promptTokens: -1 })).toThrow(
      /field promptTokens must be an integer >= 0/,
    );
    expect(() => validateJobPayload({ ...valid, promptTokens: '12' })).toThrow(/promptTokens/);
    // Charged to a tenant's counter at release: one a double cannot hold exactly is refused.
    expect(() => validateJobPayload({ ...valid, promptTokens: 2 ** 53 })).toThrow(
      /field promptTokens must be an integer >= 0/,
    );
  });

  it('accepts a replica exactly when the key space can name its reply channel and liveness key', () => {
    const keys = keySpace();
    const names = fc.oneof(
      fc.string(),
      fc.stringMatching(/^[A-Za-z0-9_.-]{1,12}$/),
      fc.constantFrom('gw 1', 'gw:1', 'gw}1', 'gw\n', 'gw-1', 'a.b_c'),
    );
    fc.assert(
      fc.property(names, (replica) => {
        let named: boolean;
        try {
          keys.replyChannel(replica);
          keys.replicaAlive(replica);
          named = true;
        } catch {
          named = false;
        }
        let accepted: boolean;
        try {
          validateJobPayload({ ...valid, replica });
          accepted = true;
        } catch {
          accepted = false;
        }
        expect(accepted).toBe(named);
      }),
    );
  });
});

describe('key space', () => {
  it('tags every key of a pool with the pool, so one script or pipeline stays in one slot', () => {
    const k = keySpace('sluice');
    expect(k.queueName('reasoning')).toBe('{pool-reasoning}');
    expect(k.queueKey('reasoning', 'wait')).toBe('sluice:{pool-reasoning}:wait');
    expect(k.jobKey('reasoning', 'job-1')).toBe('sluice:{pool-reasoning}:job-1');
    expect(k.lease('reasoning')).toBe('sluice:{pool-reasoning}:lease');
    expect(k.poolStats('reasoning')).toBe('sluice:{pool-reasoning}:stats');
    expect(k.replicaAlive('gw-1')).toBe('sluice:{replicas}:gw-1');
    expect(k.replyChannel('gw-1')).toBe('sluice:reply:gw-1');
    expect(k.replyHeartbeatChannel('gw-1')).toBe('sluice:reply-heartbeat:gw-1');
    expect(k.cancelChannel).toBe('sluice:cancel');
  });

  it('finds the pool of a stats key, and of no other key', () => {
    const k = keySpace('team-a');
    expect(k.poolStatsPattern).toBe('team-a:{pool-*}:stats');
    expect(k.poolOfStatsKey(k.poolStats('p.1'))).toBe('p.1');
    expect(k.poolOfStatsKey(k.lease('p'))).toBeUndefined();
    expect(k.poolOfStatsKey(keySpace('other').poolStats('p'))).toBeUndefined();
    expect(k.poolOfStatsKey('team-a:{pool-a}:x}:stats')).toBeUndefined();
  });

  it('refuses names that would break the key layout', () => {
    expect(() => keySpace().lease('a:b')).toThrow(/pool "a:b" may only contain/);
    expect(() => keySpace().queueName('a}b')).toThrow(/pool "a}b" may only contain/);
    expect(() => keySpace().replyChannel('')).toThrow(/replica/);
  });
});

// What vLLM reads of a client's headers travels in the payload: the request id, the W3C trace
// context and the data-parallel rank. Untrusted input: each field is checked on the way out of
// Redis as it was on the way in.
describe("job payload: the client's request headers", () => {
  const traceparent = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01';
  const context = {
    requestId: 'client-req-42',
    traceparent,
    tracestate: 'rojo=00f067aa0ba902b7,congo=t61rcWkgMzE',
    dataParallelRank: '3',
  };

  it('accepts a request id, a trace context and a data-parallel rank unchanged', () => {
    const payload = { ...valid, ...context };
    expect(validateJobPayload(payload)).toBe(payload);
    expect(validateJobPayload({ ...valid, requestId: 'a'.repeat(128) }).requestId).toHaveLength(
      128,
    );
  });

  it.each([
    [{ requestId: '' }, /field requestId must be 1 to 128 of/],
    [{ requestId: 'a'.repeat(129) }, /field requestId must be/],
    [{ requestId: 'id with blanks' }, /field requestId must be/],
    [{ requestId: 'id\r\nx-evil: 1' }, /field requestId must be/],
    [{ requestId: 42 }, /field requestId must be/],
    [{ traceparent: traceparent.toUpperCase() }, /field traceparent must be a W3C traceparent/],
    [{ traceparent: `${traceparent}\r\nx: y` }, /field traceparent must be/],
    [{ ...context, tracestate: 'Rojo=1' }, /field tracestate must be a W3C tracestate/],
    [{ tracestate: 'rojo=1' }, /field tracestate must be absent without a traceparent/],
    [{ dataParallelRank: '-1' }, /field dataParallelRank must be a string of 1 to 9 decimal/],
    [{ dataParallelRank: 3 }, /field dataParallelRank must be/],
  ])('refuses %j naming the field', (fields, message) => {
    expect(() => validateJobPayload({ ...valid, ...fields })).toThrow(message);
  });

  it('accepts fields it does not know: a newer gateway may add some (the payload stays v1)', () => {
    const newer = { ...valid, ...context, someFutureField: { x: 1 } };
    expect(validateJobPayload(newer)).toBe(newer);
  });

  it('names the headers as vLLM reads them (Starlette compares names case-insensitively)', () => {
    expect(engineRequestHeaders).toEqual({
      requestId: 'x-request-id', // _base_request_id: headers.get("X-Request-Id")
      traceparent: 'traceparent', // vllm/tracing.py TRACE_HEADERS
      tracestate: 'tracestate',
      dataParallelRank: 'x-data-parallel-rank', // headers.get("X-data-parallel-rank")
    });
  });

  it.each([
    [traceparent, true],
    ['00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00', true],
    // A later version may carry more fields after its four.
    [`01-${traceparent.slice(3)}-more.fields`, true],
    [`cc-${traceparent.slice(3)}`, true],
    [`${traceparent}-more`, false], // version 00 has exactly four
    [`ff-${traceparent.slice(3)}`, false], // version ff is invalid
    [`00-${'0'.repeat(32)}-b7ad6b7169203331-01`, false], // all-zero trace id
    ['00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01', false], // all-zero parent id
    [traceparent.toUpperCase(), false],
    [traceparent.slice(0, -1), false],
    [` ${traceparent}`, false],
    // Two traceparent headers: Node joins them, and W3C asks that neither be used.
    [`${traceparent}, ${traceparent}`, false],
    [`01-${traceparent.slice(3)}-${'x'.repeat(256)}`, false], // past 256 characters
    ['', false],
    [undefined, false],
    [['a', 'b'], false],
  ])('traceparent %j: %s', (value, ok) => {
    expect(isTraceparent(value)).toBe(ok);
  });

  it.each([
    ['congo=t61rcWkgMzE', true],
    ['rojo=00f067aa0ba902b7, congo=t61rcWkgMzE', true],
    ['rojo=1,,congo=2', true], // empty members are allowed
    ['  rojo=1 ,\tcongo=2  ', true], // blanks around members
    ['tenant1@vendor=x', true], // a multi-tenant key
    ['k=a b', true], // a blank inside a value
    ['k=~!#$%&()*+-./:;<>?@[]^_`{|}', true],
    [`k=${'v'.repeat(256)}`, true],
    [`k=${'v'.repeat(257)}`, false], // a value is 256 characters at most
    [Array.from({ length: 32 }, (_, i) => `k${i}=v`).join(','), true],
    [Array.from({ length: 33 }, (_, i) => `k${i}=v`).join(','), false], // 32 members at most
    ['Rojo=1', false], // keys are lowercase
    ['1abc=1', false], // a simple key starts with a letter
    ['rojo=a=b', false],
    ['rojo', false],
    ['rojo=', false],
    ['rojo=1;\r\nx-evil: 1', false],
    ['rojo=caf\u00e9', false],
    ['', false],
    [undefined, false],
  ])('tracestate %j: %s', (value, ok) => {
    expect(isTracestate(value)).toBe(ok);
  });

  it(`takes a tracestate of up to ${MAX_TRACESTATE_LENGTH} characters, and checks a hostile one quickly`, () => {
    const long = `k=${'v'.repeat(200)},l=${'v'.repeat(200)},m=${'v'.repeat(MAX_TRACESTATE_LENGTH - 408)}`;
    expect(long).toHaveLength(MAX_TRACESTATE_LENGTH);
    expect(isTracestate(long)).toBe(true);
    expect(isTracestate(`${long}v`)).toBe(false);
    // Blanks and commas every way a backtracking pattern could split them, then a bad end.
    const hostile = [
      `${' ,'.repeat(31)}k=${'a '.repeat(200)}`.slice(0, MAX_TRACESTATE_LENGTH - 1) + '\u0000',
      `${'k=a '.repeat(127)}=`,
      `${'a'.repeat(250)}@${'a'.repeat(250)}=`,
    ];
    const started = performance.now();
    for (const value of hostile)
      for (let i = 0; i < 100; i++) expect(isTracestate(value)).toBe(false);
    expect(performance.now() - started).toBeLessThan(500);
  });

  it.each([
    ['0', true],
    ['7', true],
    ['007', true], // Python's int() reads it as 7
    ['123456789', true],
    ['1234567890', false],
    ['-1', false],
    ['+1', false],
    [' 1', false],
    ['1.0', false],
    ['1_0', false],
    ['\u0663', false], // an Arabic-Indic 3: int() would take it, no header should carry it
    ['', false],
    [3, false],
  ])('data-parallel rank %j: %s', (value, ok) => {
    expect(isDataParallelRank(value)).toBe(ok);
  });

  it('accepts only values an HTTP header can carry as they are', () => {
    const headerSafe = /^[\t\x20-\x7e]*$/;
    fc.assert(
      fc.property(fc.string({ unit: 'binary', maxLength: 80 }), (value) => {
        for (const accepts of [isRequestId, isTraceparent, isTracestate, isDataParallelRank])
          if (accepts(value)) expect(value).toMatch(headerSafe);
      }),
    );
  });
});
