import { describe, expect, it } from 'vitest';
import { describeVariables, loadConfig } from '../src/index.js';
import { VARIABLES, type VariableName } from '../src/variables.js';
import { bad, good, select } from './cases.js';
import { envError } from './helpers.js';

const names = Object.keys(VARIABLES) as VariableName[];
const secrets: VariableName[] = ['VLLM_API_KEY', 'REDIS_PASSWORD', 'REDIS_SENTINEL_PASSWORD'];
const masked: VariableName[] = [
  'REDIS_URL',
  'REDIS_SENTINELS',
  'REDIS_CLUSTER_NODES',
  'VLLM_URL',
  'DCGM_URL',
  'GATEWAY_CORS_ALLOWED_ORIGINS',
];

describe('the variable table', () => {
  it('has bad values, a destination and (but for SLUICE_CONFIG) good values for every variable', () => {
    for (const name of names) {
      expect(bad[name], name).not.toHaveLength(0);
      expect(select[name], name).toBeTypeOf('function');
      if (name !== 'SLUICE_CONFIG') expect(good[name], name).not.toHaveLength(0);
    }
    expect(Object.keys(bad).sort()).toEqual([...names].sort());
  });

  it('is what describeVariables prints: one row per variable, each name once', () => {
    const rows = describeVariables()
      .split('\n')
      .slice(2)
      .map((row) => /^\| `([A-Z_]+)` \|/.exec(row)?.[1]);
    expect(rows).toEqual(names);
  });

  it('describes defaults, allowed values and meaning on each row', () => {
    const table = describeVariables();
    expect(table).toContain(
      '| `ADMISSION_KV_THRESHOLD` | `0.9` | a number > 0 and <= 1 | the gate closes at or above this KV-cache usage',
    );
    expect(table).toContain('| `ADMISSION_MAX_INFLIGHT` | VLLM_MAX_NUM_SEQS, else 256 |');
    expect(table).toContain('| `VLLM_API_KEY` | unset |');
    expect(table).toContain('| `REDIS_URL` | `redis://127.0.0.1:6379` |');
    for (const line of table.split('\n')) expect(line.split(/(?<!\\)\|/)).toHaveLength(6);
  });
});

describe('invalid values', () => {
  it('gives the exact one-line message of the brief', () => {
    expect(envError({ ADMISSION_KV_THRESHOLD: '1.5' }).message).toBe(
      'ADMISSION_KV_THRESHOLD="1.5" is invalid: expected a number > 0 and <= 1',
    );
    expect(envError({ PORT: '80.5' }).message).toBe(
      'PORT="80.5" is invalid: expected an integer from 0 to 65535',
    );
    expect(envError({ LOG_LEVEL: 'verbose' }).message).toBe(
      'LOG_LEVEL="verbose" is invalid: expected one of fatal, error, warn, info, debug, trace, silent',
    );
    expect(envError({ ADMISSION_MAX_INFLIGHT: '0' }).message).toBe(
      'ADMISSION_MAX_INFLIGHT="0" is invalid: expected an integer >= 1',
    );
    expect(envError({ SSE_HEARTBEAT_SECONDS: '0' }).message).toBe(
      'SSE_HEARTBEAT_SECONDS="0" is invalid: expected a number > 0 and <= 2147483',
    );
  });

  it('refuses a queue depth of 0: every request passes the queue, so it would refuse them all', () => {
    const error = envError({ VLLM_URL: 'http://e:1', VLLM_MAX_QUEUE_DEPTH: '0' });
    expect(error.variable).toBe('VLLM_MAX_QUEUE_DEPTH');
    expect(error.message).toBe('VLLM_MAX_QUEUE_DEPTH="0" is invalid: expected an integer >= 1');
    expect(
      loadConfig({ VLLM_URL: 'http://e:1', VLLM_MAX_QUEUE_DEPTH: '1' }).pools[0]?.queueDepth,
    ).toBe(1);
  });

  const cases = names.flatMap((name) => bad[name].map((raw) => [name, raw] as const));
  it.each(cases)(
    '%s=%j is refused, naming the variable, the value and what is allowed',
    (name, raw) => {
      const error = envError({ [name]: raw });
      expect(error.variable).toBe(name);
      const allowed = VARIABLES[name].allowed;
      if (secrets.includes(name))
        expect(error.message).toBe(
          `${name}=(hidden, ${raw.length} characters) is invalid: expected ${allowed}`,
        );
      else if (masked.includes(name) || raw.length > 120)
        // Credentials in a URL are masked (maskCredentials; pinned in redis.test.ts).
        expect(error.message).toMatch(new RegExp(`^${name}=".*("|…) is invalid: expected `));
      else
        expect(error.message).toBe(
          `${name}=${JSON.stringify(raw)} is invalid: expected ${allowed}`,
        );
    },
  );

  it('never shows an API key, even a broken one', () => {
    const error = envError({ VLLM_API_KEY: 'sk-very-secret value' });
    expect(error.message).not.toContain('secret');
    expect(error.message).toContain('(hidden, 20 characters)');
  });

  it('masks the credentials of a bad REDIS_URL', () => {
    const error = envError({ REDIS_URL: 'http://:hunter2@redis:6379' });
    expect(error.message).not.toContain('hunter2');
    expect(error.message).toMatch(
      /^REDIS_URL="http:\/\/\*\*\*@redis:6379" is invalid: expected a redis/,
    );
  });

  it('masks credentials written into VLLM_URL or DCGM_URL', () => {
    const engine = envError({ VLLM_URL: 'http://:s3cret@vllm:8000' });
    expect(engine.message).toBe(
      `VLLM_URL="http://***@vllm:8000" is invalid: expected ${VARIABLES.VLLM_URL.allowed}`,
    );
    const dcgm = envError({ GPU_SOURCE: 'dcgm', DCGM_URL: 'http://u:s3cret@dcgm:9400/metrics' });
    expect(dcgm.message).toBe(
      `DCGM_URL="http://***@dcgm:9400/metrics" is invalid: expected ${VARIABLES.DCGM_URL.allowed}`,
    );
  });

  it('caps a very long value in the message', () => {
    const error = envError({ SLUICE_REPLICA_ID: 'y'.repeat(5000) });
    expect(error.message.length).toBeLessThan(400);
  });

  it('reports the first bad variable in table order', () => {
    expect(envError({ LOG_LEVEL: 'loud', PORT: 'http' }).variable).toBe('PORT');
  });
});

describe('valid values', () => {
  const cases = names.flatMap((name) =>
    good[name].map(([raw, expected, env]) => [name, raw, expected, env ?? {}] as const),
  );
  it.each(cases)('%s=%j is accepted and lands in the config', (name, raw, expected, env) => {
    expect(select[name](loadConfig({ ...env, [name]: raw }))).toEqual(expected);
  });
});
