import { describe, expect, it } from 'vitest';
import { loadConfig, maskCredentials } from '../src/index.js';
import { VARIABLES } from '../src/variables.js';
import { envError } from './helpers.js';

const sentinel = { REDIS_SENTINELS: 's1:26379,s2:26379', REDIS_SENTINEL_MASTER: 'mymaster' };

describe('the Redis topology', () => {
  it('is a single node at the default URL when nothing is set', () => {
    expect(loadConfig({}).redis).toEqual({
      kind: 'single',
      url: 'redis://127.0.0.1:6379',
      prefix: 'sluice',
    });
  });

  it('is Sentinel with the sentinels, the master name and every credential', () => {
    expect(
      loadConfig({
        ...sentinel,
        REDIS_SENTINEL_PASSWORD: 'sp',
        REDIS_USERNAME: 'sluice',
        REDIS_PASSWORD: 'dp',
        REDIS_TLS_CA_FILE: '/ca.pem',
      }).redis,
    ).toEqual({
      kind: 'sentinel',
      sentinels: [
        { host: 's1', port: 26379 },
        { host: 's2', port: 26379 },
      ],
      masterName: 'mymaster',
      sentinelPassword: 'sp',
      username: 'sluice',
      password: 'dp',
      tlsCaFile: '/ca.pem',
      prefix: 'sluice',
    });
  });

  it('is Cluster with the seed nodes and the prefix', () => {
    expect(
      loadConfig({ REDIS_CLUSTER_NODES: 'n1:7000', REDIS_PASSWORD: 'pw', SLUICE_REDIS_PREFIX: 'a' })
        .redis,
    ).toEqual({
      kind: 'cluster',
      nodes: [{ host: 'n1', port: 7000 }],
      password: 'pw',
      prefix: 'a',
    });
  });

  it('takes a password for a URL without credentials', () => {
    expect(loadConfig({ REDIS_URL: 'redis://r:6379', REDIS_PASSWORD: 'pw' }).redis).toMatchObject({
      kind: 'single',
      url: 'redis://r:6379',
      password: 'pw',
    });
  });
});

describe('contradictions name the variable at fault', () => {
  it('refuses Sentinel and Cluster together', () => {
    const error = envError({ ...sentinel, REDIS_CLUSTER_NODES: 'n1:7000' });
    expect(error.variable).toBe('REDIS_CLUSTER_NODES');
    expect(error.message).toBe(
      'REDIS_CLUSTER_NODES="n1:7000" is invalid: expected unset when REDIS_SENTINELS is set (one topology at a time)',
    );
  });

  it('refuses REDIS_URL with Sentinel or Cluster, hiding its password', () => {
    const error = envError({ ...sentinel, REDIS_URL: 'redis://:hunter2@r:6379' });
    expect(error.variable).toBe('REDIS_URL');
    expect(error.message).toBe(
      'REDIS_URL="redis://***@r:6379" is invalid: expected unset when REDIS_SENTINELS is set (the nodes come from REDIS_SENTINELS)',
    );
    expect(envError({ REDIS_CLUSTER_NODES: 'n:1', REDIS_URL: 'redis://r' }).message).toContain(
      'expected unset when REDIS_CLUSTER_NODES is set',
    );
  });

  it('needs the master name with the sentinels', () => {
    const error = envError({ REDIS_SENTINELS: 's1:26379' });
    expect(error.variable).toBe('REDIS_SENTINELS');
    expect(error.message).toMatch(/expected REDIS_SENTINEL_MASTER set too/);
  });

  it('refuses the sentinel-only variables without sentinels', () => {
    expect(envError({ REDIS_SENTINEL_MASTER: 'm' }).variable).toBe('REDIS_SENTINEL_MASTER');
    const error = envError({ REDIS_CLUSTER_NODES: 'n:1', REDIS_SENTINEL_PASSWORD: 'secret' });
    expect(error.variable).toBe('REDIS_SENTINEL_PASSWORD');
    expect(error.message).not.toContain('secret');
  });

  it('refuses credentials in two places', () => {
    const error = envError({ REDIS_URL: 'redis://u:p@r:6379', REDIS_PASSWORD: 'other' });
    expect(error.variable).toBe('REDIS_PASSWORD');
    expect(error.message).toBe(
      'REDIS_PASSWORD=(hidden, 5 characters) is invalid: expected unset when REDIS_URL carries credentials',
    );
    expect(envError({ REDIS_URL: 'redis://:p@r', REDIS_USERNAME: 'u' }).variable).toBe(
      'REDIS_USERNAME',
    );
  });

  it('refuses a CA file for a plain redis:// URL rather than silently not using TLS', () => {
    const error = envError({ REDIS_URL: 'redis://r:6379', REDIS_TLS_CA_FILE: '/ca.pem' });
    expect(error.variable).toBe('REDIS_TLS_CA_FILE');
    expect(error.message).toBe(
      'REDIS_TLS_CA_FILE="/ca.pem" is invalid: expected unset unless REDIS_URL is rediss:// (REDIS_URL="redis://r:6379")',
    );
  });
});

describe('REDIS_URL credentials are masked wherever the URL is shown', () => {
  // The host follows the last '@': ioredis logs in with the password `p@ss`.
  it('hides a password that holds an @, up to the last one', () => {
    expect(loadConfig({ REDIS_URL: 'redis://:p@ss@host:6379' }).redis).toMatchObject({
      kind: 'single',
      url: 'redis://:p@ss@host:6379',
    });
    expect(maskCredentials('redis://:p@ss@host:6379')).toBe('redis://***@host:6379');
    expect(maskCredentials('rediss://user:a@b@c@host:6380/2')).toBe('rediss://***@host:6380/2');
    const error = envError({ ...sentinel, REDIS_URL: 'redis://:p@ss@host:6379' });
    expect(error.variable).toBe('REDIS_URL');
    expect(error.message).toBe(
      'REDIS_URL="redis://***@host:6379" is invalid: expected unset when REDIS_SENTINELS is set (the nodes come from REDIS_SENTINELS)',
    );
    const bad = envError({ REDIS_URL: 'redis://:p@ss@host:6379/x' });
    expect(bad.message).toMatch(/^REDIS_URL="redis:\/\/\*\*\*@host:6379\/x" is invalid: expected /);
  });

  it.each([
    ['redis:/:s3cret@host:6379', 'redis:/***@host:6379'],
    ['redis//:s3cret@host', '***@host'],
    ['redis:s3cret@host', '***@host'],
    ['redis://:s3cret', 'redis://:***'],
    ['redis://default:s3cret', 'redis://default:***'],
    ['redis://[::1]:s3cret', 'redis://[::1]:***'],
    ['redis://:pa/s3cret', 'redis://:***'],
    ['redis://:pa/s3cret@host:6379', 'redis://***@host:6379'],
    ['redis://:pa#s3cret@host:6379', 'redis://***@host:6379'],
    ['redis://host:6379/0?password=s3cret', 'redis://host:6379/0?***'],
    ['redis://host:6379#s3cret', 'redis://host:6379#***'],
  ])('refuses the malformed %s, showing only %s', (raw, shown) => {
    const error = envError({ REDIS_URL: raw });
    expect(error.variable).toBe('REDIS_URL');
    expect(error.message).toBe(
      `REDIS_URL="${shown}" is invalid: expected ${VARIABLES.REDIS_URL.allowed}`,
    );
    expect(error.message).not.toContain('s3cret');
  });

  // ioredis reads a query's parameters as options over the ones each role sets
  // (`commandTimeout`, `maxRetriesPerRequest`), and a password there would be shown.
  it('refuses a query, saying what to use instead', () => {
    for (const raw of [
      'redis://host:6379/0?password=hunter2',
      'redis://host:6379?commandTimeout=0',
      'rediss://:pw@host:6380?tls=true',
    ]) {
      const error = envError({ REDIS_URL: raw });
      expect(error.variable).toBe('REDIS_URL');
      expect(error.message).toMatch(/^REDIS_URL="[^"?]*\?\*\*\*" is invalid: expected /);
      expect(error.message).toContain('without a query');
      expect(error.message).toContain('REDIS_USERNAME, REDIS_PASSWORD, and rediss:// for TLS');
      expect(error.message).not.toMatch(/hunter2|commandTimeout|tls=|:pw@/);
    }
  });

  it('masks the node lists in their errors too', () => {
    const sentinels = envError({
      REDIS_SENTINELS: ':s3cret@s1:26379,redis://u:s3cret@s2:26379',
      REDIS_SENTINEL_MASTER: 'm',
    });
    expect(sentinels.variable).toBe('REDIS_SENTINELS');
    expect(sentinels.message).toBe(
      `REDIS_SENTINELS="***@s1:26379,redis://***@s2:26379" is invalid: expected ${VARIABLES.REDIS_SENTINELS.allowed}`,
    );
    const nodes = envError({ REDIS_CLUSTER_NODES: 'n1:7000, :s3cret@n2:7000' });
    expect(nodes.variable).toBe('REDIS_CLUSTER_NODES');
    expect(nodes.message).toBe(
      `REDIS_CLUSTER_NODES="n1:7000,***@n2:7000" is invalid: expected ${VARIABLES.REDIS_CLUSTER_NODES.allowed}`,
    );
    // A list with no credentials in it reads as written.
    expect(envError({ REDIS_CLUSTER_NODES: '::1:7000' }).message).toContain('"::1:7000"');
  });

  it('leaves a URL without credentials as it is', () => {
    for (const url of [
      'redis://[::1]:6379',
      'redis://127.0.0.1:6379',
      'rediss://redis.internal:6380/2',
      'redis://[::1]:6379/',
    ])
      expect(maskCredentials(url)).toBe(url);
  });
});
