// The YAML file's `tenants` list: who may use the engines, with which keys, and on what terms
// (docs/broker.md, "Tenants and fair share"). Plain keys are hashed on load and never kept:
// the config holds only SHA-256 digests, so nothing downstream can print a key.
import { createHash } from 'node:crypto';
import type { FileChecker } from './file.js';
import { decimal, integer, matching, type Rule } from './rules.js';
import type { TenantConfig } from './types.js';

const TENANT_KEYS = ['name', 'apiKeys', 'apiKeySha256', 'weight', 'maxQueued', 'maxPriority'];

const tenantName = matching(/^[A-Za-z0-9_.-]{1,63}$/, "1 to 63 letters, digits, '_', '.' or '-'");
const weight = decimal({ min: 0, exclusiveMin: true });
const maxQueued = integer(1);
/** A key worth the name: long enough not to be guessed, no blanks a copy-paste might add. */
const plainKey: Rule<string> = {
  allowed: 'a key of 8 to 512 characters without blanks',
  fromText: (raw) => (/^\S{8,512}$/.test(raw) ? raw : undefined),
  fromValue: (value) =>
    typeof value === 'string' && /^\S{8,512}$/.test(value) ? value : undefined,
};
const digest = matching(/^[0-9a-fA-F]{64}$/, 'a SHA-256 digest: 64 hex digits', (raw) =>
  raw.toLowerCase(),
);

/** The SHA-256 digest of a key as lower-case hex: how keys are stored and compared. */
export function keyDigest(key: string): string {
  return createHash('sha256').update(key, 'utf8').digest('hex');
}

type Mapping = Record<string, unknown>;

/**
 * Reads `tenants` when the file has it; undefined when it does not (no keys asked for).
 * `maxPriority` is the SLUICE_MAX_PRIORITY bound no tenant's may exceed.
 */
export function readTenants(
  check: FileChecker,
  root: Mapping,
  maxPriority: number,
): TenantConfig[] | undefined {
  if (!Object.hasOwn(root, 'tenants')) return undefined;
  const list = check.list(root['tenants'], 'tenants', 'tenants', false);
  if (list.length === 0)
    throw check.error('tenants', 'is empty: remove it to serve without API keys');
  const names = new Map<string, string>();
  const digestAt = new Map<string, string>();
  const priority = integer(0, maxPriority);
  return list.map((raw, i) => {
    const path = `tenants[${i}]`;
    const entry = check.mapping(raw, path, TENANT_KEYS);
    const name = check.required(entry, 'name', path, tenantName);
    const previous = names.get(name);
    if (previous !== undefined)
      throw check.invalid(
        `${path}.name`,
        name,
        `a name not used elsewhere (already at ${previous})`,
      );
    names.set(name, path);
    const keySha256: string[] = [];
    const claim = (value: string, at: string) => {
      const other = digestAt.get(value);
      if (other !== undefined)
        throw check.error(at, `is the same key as ${other}: a key names one tenant`);
      digestAt.set(value, at);
      keySha256.push(value);
    };
    readList(check, entry, 'apiKeys', path).forEach((value, j) => {
      const at = `${path}.apiKeys[${j}]`;
      const key = plainKey.fromValue(value);
      if (key === undefined) throw check.invalid(at, value, plainKey.allowed, true);
      claim(keyDigest(key), at);
    });
    readList(check, entry, 'apiKeySha256', path).forEach((value, j) => {
      const at = `${path}.apiKeySha256[${j}]`;
      const hex = digest.fromValue(value);
      if (hex === undefined) throw check.invalid(at, value, digest.allowed);
      claim(hex, at);
    });
    if (keySha256.length === 0)
      throw check.error(path, 'has no key: expected apiKeys or apiKeySha256 with at least one');
    const tenant: TenantConfig = {
      name,
      keySha256,
      weight: check.optional(entry, 'weight', path, weight) ?? 1,
      maxPriority: check.optional(entry, 'maxPriority', path, priority) ?? 0,
    };
    const bound = check.optional(entry, 'maxQueued', path, maxQueued);
    if (bound !== undefined) tenant.maxQueued = bound;
    return tenant;
  });
}

function readList(check: FileChecker, entry: Mapping, key: string, path: string): unknown[] {
  if (!Object.hasOwn(entry, key)) return [];
  return check.list(entry[key], `${path}.${key}`, 'keys', true);
}
