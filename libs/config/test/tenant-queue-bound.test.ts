// A tenant's `maxQueued` against the depth of the pools it shares with the other tenants: the
// gateway checks a pool's depth before the tenant's bound, so a tenant allowed the whole queue
// fills it and every other tenant gets 503 queue_full instead of its turn in the fair share.
import { describe, expect, it } from 'vitest';
import { fileError, loadFile } from './helpers.js';

/** Pools (`name: depth`, null for the environment's depth), then tenants (YAML lines). */
const file = (pools: Record<string, number | null>, ...tenants: string[]) =>
  [
    'pools:',
    ...Object.entries(pools).map(
      ([name, depth], i) =>
        `  - { name: ${name}, models: [${name}]${depth === null ? '' : `, queueDepth: ${depth}`}, engines: [{ url: "http://e${i}:1" }] }`,
    ),
    'tenants:',
    ...tenants,
    '',
  ].join('\n');

const bounds = (yaml: string, env: Record<string, string> = {}) =>
  loadFile(yaml, env).tenants!.map((t) => t.maxQueued);

describe('SLUICE_CONFIG: a tenant maxQueued below the queue depth', () => {
  it('refuses a maxQueued at or above a pool depth, naming the tenant, the pool and both values', () => {
    // The reported case: alpha may queue 20 in a pool of depth 8 (VLLM_MAX_QUEUE_DEPTH's default).
    const yaml = file(
      { main: null },
      '  - { name: alpha, apiKeys: [sk-test-ka-0123456789abcdef012345678], maxQueued: 20 }',
      '  - { name: beta, apiKeys: [sk-test-kb-0123456789abcdef012345678] }',
    );
    const error = fileError(yaml);
    expect(error.variable).toBe('tenants[0].maxQueued');
    expect(error.message).toBe(
      "/etc/sluice.yaml: tenants[0].maxQueued=20 is invalid: expected an integer from 1 to 7, below every pool's queueDepth, so that tenant alpha alone cannot fill the queue of pool main (queueDepth 8) and lock the other tenants out of it with 503 queue_full",
    );
    // Exactly the depth is refused too: the pool is full before the tenant's bound is reached.
    const atDepth = fileError(
      file(
        { main: 4 },
        '  - { name: a, apiKeys: [sk-test-ka-0123456789abcdef012345678] }',
        '  - { name: b, apiKeys: [sk-test-kb-0123456789abcdef012345678], maxQueued: 4 }',
      ),
    );
    expect(atDepth.variable).toBe('tenants[1].maxQueued');
    expect(atDepth.message).toContain(
      'tenants[1].maxQueued=4 is invalid: expected an integer from 1 to 3',
    );
    expect(atDepth.message).toContain(
      'tenant b alone cannot fill the queue of pool main (queueDepth 4)',
    );
    // Depth from the environment.
    expect(
      fileError(
        file(
          { main: null },
          '  - { name: a, apiKeys: [sk-test-ka-0123456789abcdef012345678], maxQueued: 8 }',
        ),
        {
          VLLM_MAX_QUEUE_DEPTH: '8',
        },
      ).variable,
    ).toBe('tenants[0].maxQueued');
    expect(
      bounds(
        file(
          { main: null },
          '  - { name: a, apiKeys: [sk-test-ka-0123456789abcdef012345678], maxQueued: 19 }',
        ),
        {
          VLLM_MAX_QUEUE_DEPTH: '20',
        },
      ),
    ).toEqual([19]);
  });

  it('checks against the shallowest pool: every tenant may use every pool', () => {
    const yaml = (q: number) =>
      file(
        { deep: 100, shallow: 5 },
        `  - { name: a, apiKeys: [sk-test-ka-0123456789abcdef012345678], maxQueued: ${q} }`,
      );
    expect(bounds(yaml(4))).toEqual([4]);
    const error = fileError(yaml(50));
    expect(error.message).toContain(
      "expected an integer from 1 to 4, below every pool's queueDepth, so that tenant a alone cannot fill the queue of pool shallow (queueDepth 5)",
    );
  });

  it('allows no maxQueued with a pool of depth 1, saying what to change', () => {
    const error = fileError(
      file(
        { main: 8, one: 1 },
        '  - { name: a, apiKeys: [sk-test-ka-0123456789abcdef012345678], maxQueued: 1 }',
      ),
    );
    expect(error.variable).toBe('tenants[0].maxQueued');
    expect(error.message).toBe(
      '/etc/sluice.yaml: tenants[0].maxQueued=1 is invalid: expected no maxQueued while pool one has queueDepth 1 (any bound would be at its depth; raise its queueDepth to bound tenant a), so that tenant a alone cannot fill the queue of pool one (queueDepth 1) and lock the other tenants out of it with 503 queue_full',
    );
  });

  it('gives a tenant without maxQueued one below the shallowest depth, when several tenants share the pools and such a bound exists', () => {
    expect(
      bounds(
        file(
          { deep: 100, shallow: 6 },
          '  - { name: a, apiKeys: [sk-test-ka-0123456789abcdef012345678] }',
          '  - { name: b, apiKeys: [sk-test-kb-0123456789abcdef012345678], maxQueued: 2 }',
          '  - { name: c, apiKeys: [sk-test-kc-0123456789abcdef012345678] }',
        ),
      ),
    ).toEqual([5, 2, 5]);
    // No default where no bound below the depth exists or nobody shares the queue.
    // One tenant competes only with itself.
    expect(
      bounds(file({ main: 8 }, '  - { name: a, apiKeys: [sk-test-ka-0123456789abcdef012345678] }')),
    ).toEqual([undefined]);
    // A pool of depth 1 leaves no room below it.
    expect(
      bounds(
        file(
          { one: 1 },
          '  - { name: a, apiKeys: [sk-test-ka-0123456789abcdef012345678] }',
          '  - { name: b, apiKeys: [sk-test-kb-0123456789abcdef012345678] }',
        ),
      ),
    ).toEqual([undefined, undefined]);
    // No pools in the file: nothing to share yet.
    expect(
      loadFile(
        'pools: []\ntenants:\n  - { name: a, apiKeys: [sk-test-ka-0123456789abcdef012345678], maxQueued: 50 }\n  - { name: b, apiKeys: [sk-test-kb-0123456789abcdef012345678] }\n',
      ).tenants!.map((t) => t.maxQueued),
    ).toEqual([50, undefined]);
  });
});
