// The YAML file's `tenants:` list: who may use the gateway and on what terms. Plain keys are
// hashed on load and never kept: the config, its errors and anything that logs the config
// hold only SHA-256 digests, so `apiKeySha256` lets the file itself hold no secret either.
import { createHash } from 'node:crypto';
import type { FileChecker } from './file.js';
import { decimal, integer, matching, type Rule } from './rules.js';
import type { PoolConfig, TenantConfig } from './types.js';
import { shared } from './variables.js';

const KEYS = ['name', 'apiKeys', 'apiKeySha256', 'weight', 'maxQueued', 'maxPriority'] as const;

const rules = {
  name: matching(/^[A-Za-z0-9_.-]{1,63}$/, "1 to 63 letters, digits, '_', '.' or '-'"),
  digest: matching(
    /^[0-9A-Fa-f]{64}$/,
    '64 hexadecimal digits (printf %s "$KEY" | sha256sum)',
    (raw) => raw.toLowerCase(),
  ),
  weight: decimal({ min: 0, exclusiveMin: true }),
  maxQueued: integer(1),
} as const;

/**
 * The shortest plain tenant key accepted. A key is the only thing between a stranger and the
 * engines, so a short one is a configuration mistake (`test`, `a`) that becomes a guessable
 * credential. 32 characters is 128 bits in hex, the least dense way keys are usually written
 * (`openssl rand -hex 16`), so every random key of 128 bits or more passes whatever its
 * encoding, while no word or phrase short enough to guess does. Length is not entropy: 32
 * `a`s pass too; the check catches mistakes, not a poor generator. vLLM's `--api-key` has no
 * minimum, but it guards one engine; here one key opens every pool. Digests
 * (`apiKeySha256`) cannot be checked: the key behind one is not known here.
 */
export const MIN_TENANT_KEY_LENGTH = 32;
const LONG_ENOUGH = `a key of at least ${MIN_TENANT_KEY_LENGTH} characters, random (e.g. sk-$(openssl rand -hex 24)): a short key can be guessed`;

/** Lower-case hex SHA-256 of a key's UTF-8 bytes: what `sha256sum` prints for it. */
export function keyDigest(key: string): string {
  return createHash('sha256').update(key, 'utf8').digest('hex');
}

/** What a tenant's `maxQueued` may be, given the shallowest pool it can use. */
function queuedBelowDepth(tenant: string, pool: PoolConfig): string {
  const why = `so that tenant ${tenant} alone cannot fill the queue of pool ${pool.name} (queueDepth ${pool.queueDepth}) and lock the other tenants out of it with 503 queue_full`;
  return pool.queueDepth > 1
    ? `an integer from 1 to ${pool.queueDepth - 1}, below every pool's queueDepth, ${why}`
    : `no maxQueued while pool ${pool.name} has queueDepth 1 (any bound would be at its depth; raise its queueDepth to bound tenant ${tenant}), ${why}`;
}

/** `maxPriority` may not exceed SLUICE_MAX_PRIORITY: the header is clamped to that anyway. */
function priorityRule(max: number): Rule<number> {
  const base = integer(0, max);
  return { ...base, allowed: `${base.allowed} (SLUICE_MAX_PRIORITY)` };
}

/**
 * The pool whose `queueDepth` bounds every tenant's `maxQueued`: the shallowest (the first of
 * them in file order). Every tenant may use every pool, and the gateway's admission script
 * checks the pool's depth before the tenant's bound, so a tenant allowed as many queued
 * requests as a pool's depth fills that pool's queue and every other tenant gets 503
 * `queue_full` instead of its place in the fair share. Undefined without pools.
 */
function shallowestPool(pools: readonly PoolConfig[]): PoolConfig | undefined {
  let pool: PoolConfig | undefined;
  for (const p of pools) if (pool === undefined || p.queueDepth < pool.queueDepth) pool = p;
  return pool;
}

/**
 * Reads `tenants` from the file's root mapping; `undefined` when the key is absent (no keys
 * are asked for). Names and keys are unique across tenants: one key in two tenants would make
 * the tenant of a request depend on lookup order. `pools` are the file's, read before: a
 * `maxQueued` must stay below each one's `queueDepth` (shallowestPool), and with several
 * tenants one without `maxQueued` gets the largest value allowed, so that one tenant alone
 * cannot fill a queue the others share.
 */
export function readTenants(
  check: FileChecker,
  root: Record<string, unknown>,
  maxPriority: number,
  pools: readonly PoolConfig[],
): TenantConfig[] | undefined {
  if (!Object.hasOwn(root, 'tenants')) return undefined;
  const raw = root['tenants'];
  if (Array.isArray(raw) && raw.length === 0)
    throw check.invalid(
      'tenants',
      raw,
      'a non-empty list of tenants (remove the key to run without tenants)',
    );
  const list = check.list(raw, 'tenants', 'tenants', true);
  const priority = priorityRule(maxPriority);
  const shallowest = shallowestPool(pools);
  // A single tenant only competes with itself: a default bound would turn some of its 503s
  // into 429s and keep one place of the queue empty, for no one.
  const defaultMaxQueued =
    list.length > 1 && shallowest !== undefined && shallowest.queueDepth > 1
      ? shallowest.queueDepth - 1
      : undefined;
  const nameAt = new Map<string, string>();
  const digestAt = new Map<string, string>();

  // `written` is what the file has at `at`: a plain key there is never shown (FileChecker).
  const claim = (digest: string, at: string, written: string) => {
    const other = digestAt.get(digest);
    if (other === undefined) return digestAt.set(digest, at);
    throw check.invalid(at, written, `a key no other entry has (already at ${other})`);
  };

  return list.map((rawTenant, t): TenantConfig => {
    const path = `tenants[${t}]`;
    const tenant = check.mapping(rawTenant, path, KEYS);
    const name = check.required(tenant, 'name', path, rules.name);
    const previous = nameAt.get(name);
    if (previous !== undefined)
      throw check.invalid(`${path}.name`, name, `a name not used by another tenant (${previous})`);
    nameAt.set(name, path);

    const keySha256: string[] = [];
    if (Object.hasOwn(tenant, 'apiKeys'))
      check.list(tenant['apiKeys'], `${path}.apiKeys`, 'keys', false).forEach((item, k) => {
        const at = `${path}.apiKeys[${k}]`;
        const key = shared.apiKey.fromValue(item);
        if (key === undefined) throw check.invalid(at, item, shared.apiKey.allowed);
        if (key.length < MIN_TENANT_KEY_LENGTH) throw check.invalid(at, item, LONG_ENOUGH);
        const digest = keyDigest(key);
        claim(digest, at, key);
        keySha256.push(digest);
      });
    if (Object.hasOwn(tenant, 'apiKeySha256'))
      check
        .list(tenant['apiKeySha256'], `${path}.apiKeySha256`, 'SHA-256 digests', false)
        .forEach((item, k) => {
          const at = `${path}.apiKeySha256[${k}]`;
          const digest = rules.digest.fromValue(item);
          if (digest === undefined) throw check.invalid(at, item, rules.digest.allowed);
          claim(digest, at, digest);
          keySha256.push(digest);
        });
    if (keySha256.length === 0)
      throw check.error(
        path,
        'has no key: expected apiKeys or apiKeySha256 with at least one entry',
      );

    const maxQueued =
      check.optional(tenant, 'maxQueued', path, rules.maxQueued) ?? defaultMaxQueued;
    if (shallowest !== undefined && maxQueued !== undefined && maxQueued >= shallowest.queueDepth)
      throw check.invalid(`${path}.maxQueued`, maxQueued, queuedBelowDepth(name, shallowest));
    return {
      name,
      keySha256,
      weight: check.optional(tenant, 'weight', path, rules.weight) ?? 1,
      ...(maxQueued === undefined ? {} : { maxQueued }),
      maxPriority: check.optional(tenant, 'maxPriority', path, priority) ?? 0,
    };
  });
}
