import { describe, expect, it } from 'vitest';
import { decodeFrame, encodeFrame } from '../src/frames.ts';
import { ProtocolError } from '../src/errors.ts';
import { refusal, refusalKinds, rejectReasons, type RejectReason } from '../src/reasons.ts';

const reasons = Object.keys(refusalKinds) as RejectReason[];

describe('the refusal table', () => {
  it('gives every 503 and 429 a Retry-After, and no other status one', () => {
    for (const reason of reasons) {
      const r = refusal(reason, 'm');
      const retryable = r.status === 503 || r.status === 429;
      expect(r.retryAfter !== undefined, reason).toBe(retryable);
    }
  });

  it('maps statuses to the OpenAI error types', () => {
    expect(refusal('queue_full', 'm')).toMatchObject({ status: 503, type: 'server_error' });
    expect(refusal('tenant_queue_full', 'm')).toMatchObject({
      status: 429,
      type: 'rate_limit_error',
    });
    expect(refusal('auth_throttled', 'm', 42)).toMatchObject({
      status: 429,
      type: 'rate_limit_error',
      retryAfter: 42,
    });
    expect(refusal('invalid_api_key', 'm')).toMatchObject({
      status: 401,
      type: 'invalid_request_error',
    });
    expect(refusal('bad_request', 'm')).toMatchObject({
      status: 400,
      type: 'invalid_request_error',
    });
    expect(refusal('engine_error', 'm')).toMatchObject({ status: 502, type: 'server_error' });
    expect(rejectReasons.model_not_found).toBe(404);
  });

  it('takes an estimate over the default, rounded up to whole seconds of at least 1', () => {
    expect(refusal('no_leader', 'm').retryAfter).toBe(5);
    expect(refusal('no_leader', 'm', 12.2).retryAfter).toBe(13);
    expect(refusal('no_leader', 'm', 0).retryAfter).toBe(1);
    expect(refusal('bad_request', 'm', 30).retryAfter).toBeUndefined();
  });
});

describe('error frames', () => {
  it("read a reason not in this side's table as internal_error, the code named (a newer dispatcher)", () => {
    const newer = Buffer.from('Xjob 0\n{"code":"engine_sleeping","message":"m","retryAfter":3}');
    expect(decodeFrame(newer)).toEqual({
      type: 'error',
      jobId: 'job',
      seq: 0,
      info: {
        code: 'internal_error',
        message: 'm (engine_sleeping, unknown to this gateway)',
        retryAfter: 3,
      },
    });
    const odd = Buffer.from('Xjob 0\n{"code":"<b>\\n</b>","message":"m"}');
    expect(decodeFrame(odd)).toMatchObject({ info: { code: 'internal_error', message: 'm' } });
  });

  it('refuse a reason that is not a string', () => {
    const forged = Buffer.from('Xjob 0\n{"code":7,"message":"m"}');
    expect(() => decodeFrame(forged)).toThrow(ProtocolError);
  });

  it('refuse a Retry-After that is not a non-negative number', () => {
    const forged = Buffer.from('Xjob 0\n{"code":"queue_lost","message":"m","retryAfter":"soon"}');
    expect(() => decodeFrame(forged)).toThrow(/retryAfter/);
  });

  it('carry a reason and its Retry-After through', () => {
    const frame = {
      type: 'error' as const,
      jobId: 'j',
      seq: 2,
      info: { code: 'redis_unavailable' as const, message: 'Redis lost', retryAfter: 3 },
    };
    expect(decodeFrame(encodeFrame(frame))).toEqual(frame);
  });
});
