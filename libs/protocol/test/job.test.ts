import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import {
  BULL_MAX_PRIORITY,
  bullPriority,
  jobBody,
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
