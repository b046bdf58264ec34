// Tenants do not share the engine's prefix cache: with tenants (and SLUICE_TENANT_CACHE_SALT
// on, the default) every completion request, gated or pass-through, goes on with its tenant's
// own vLLM `cache_salt`, whatever the client sent. Without it, a tenant could learn another's
// prompt by timing: a guess that matches a prompt the engine has cached is answered in a
// fraction of the prefill time.
//
// What vLLM does with the field:
// - Declared on both completion request models, `cache_salt: str | None` ("If specified, the
//   prefix cache will be salted with the provided string to prevent an attacker to guess
//   prompts in multi-user environments"): `ChatCompletionRequest` and `CompletionRequest` in
//   vllm/entrypoints/openai/protocol.py, later vllm/entrypoints/openai/chat_completion/protocol.py
//   and completion/protocol.py (`min_length=1, max_length=1024`).
// - Validated by a `check_cache_salt_support` model validator: "Parameter 'cache_salt' must be
//   a non-empty string if provided.", and refused on the V0 engine ("Parameter 'cache_salt' is
//   not supported with this instance of vLLM, which uses engine V0."); newer releases call
//   `validate_cache_salt` (vllm/entrypoints/generate/base/protocol.py): at most 128 characters,
//   none of '@', '/', '\' or NUL. A salt here is 64 lower-case hex digits: valid everywhere.
// - Mixed into the hash of the prompt's first full block only, `cache_salt_keys =
//   [request.cache_salt] if (start_token_idx == 0 and request.cache_salt) else []`
//   (vllm/v1/core/kv_cache_utils.py `generate_block_hash_extra_keys`); each block's hash
//   chains its parent's (`hash_block_tokens`: `hash_function((parent_block_hash,
//   curr_block_token_ids_tuple, extra_keys))`), so two salts share no cached block at all.
//
// How the salt gets in without parsing the body: the peek has checked that the body is one
// JSON object, so `,"cache_salt":"<salt>"` goes in front of its closing brace (no comma for
// `{}`) and becomes its last member. vLLM's routes take the body as a pydantic model parameter
// (`create_chat_completion(request: ChatCompletionRequest, raw_request: Request)`,
// vllm/entrypoints/openai/api_server.py, later chat_completion/api_router.py), which FastAPI
// reads with `await request.json()` (fastapi/routing.py `get_request_handler`; Starlette's
// `Request.json` is the standard library's `json.loads`) before pydantic validates the dict.
// Python's json keeps the last of duplicate names: "this module does not raise an exception;
// instead, it ignores all but the last name-value pair for a given name"
// (docs.python.org/3/library/json.html#repeated-names-within-an-object); pydantic's own JSON
// parser (`model_validate_json`) keeps the last one too (both checked with CPython 3 and
// pydantic 2.13). So a client's own `cache_salt`, wherever it stands in the body, is replaced:
// no client picks another tenant's salt. JSON.parse (the engine simulator) keeps the last too.
//
// The salt is derived once per tenant at start-up from what clients do not have: SHA-256 over
// a fixed label, the tenant's name and its sorted key digests. Knowing tenant names is not
// enough to compute one; the gateway never shows it; and it is the same on every replica, so a
// tenant's requests share the cache whichever replica and engine they pass. Changing a tenant's
// keys changes its salt: its cached prefixes go cold once.
import { createHash } from 'node:crypto';
import type { TenantConfig } from '@sluice/config';

/** The request field (vLLM's name). */
export const CACHE_SALT_FIELD = 'cache_salt';

/** Fixed label in front of every derivation: a new scheme gets a new label. */
const LABEL = 'sluice tenant cache_salt v1';

/**
 * A tenant's salt: lower-case hex SHA-256 of the label, its name and its key digests in sorted
 * order (so the file's order of `apiKeys` and `apiKeySha256` does not matter), NUL-separated.
 */
export function tenantCacheSalt(tenant: Pick<TenantConfig, 'name' | 'keySha256'>): string {
  const hash = createHash('sha256').update(LABEL).update('\0').update(tenant.name);
  for (const digest of [...tenant.keySha256].sort()) hash.update('\0').update(digest);
  return hash.digest('hex');
}

/** `,"cache_salt":"<salt>"`: the member appended to a body (JSON-escaped, though hex needs none). */
export function saltMember(salt: string): Buffer {
  return Buffer.from(`,${JSON.stringify(CACHE_SALT_FIELD)}:${JSON.stringify(salt)}`, 'utf8');
}

const RBRACE = 0x7d;
const LBRACE = 0x7b;

/** JSON's insignificant whitespace (RFC 8259: space, tab, line feed, carriage return). */
function isBlank(c: number): boolean {
  return c === 0x20 || c === 0x09 || c === 0x0a || c === 0x0d;
}

/**
 * `body`, a JSON object (the peek has checked it), with `member` (from `saltMember`) as its
 * last member: put in front of the closing brace, found after any trailing whitespace, without
 * the comma when the object is empty. A non-empty object's last value ends in `"`, `}`, `]`, a
 * digit or a letter, never in `{`: so the object is empty exactly when `{` is the first
 * non-blank byte before its closing brace. Every other byte is copied as it is, once.
 */
export function withCacheSalt(body: Buffer, member: Buffer): Buffer {
  let close = body.length - 1;
  while (close >= 0 && isBlank(body[close]!)) close--;
  if (close < 0 || body[close] !== RBRACE)
    throw new TypeError('withCacheSalt: the body is not a JSON object');
  let before = close - 1;
  while (before >= 0 && isBlank(body[before]!)) before--;
  const added = body[before] === LBRACE ? member.subarray(1) : member;
  return Buffer.concat(
    [body.subarray(0, close), added, body.subarray(close)],
    body.length + added.length,
  );
}

/** Every tenant's salt member, computed once at start-up; the body rewrite per request. */
export class CacheSalts {
  private readonly members = new Map<string, Buffer>();

  constructor(tenants: readonly TenantConfig[]) {
    for (const tenant of tenants)
      this.members.set(tenant.name, saltMember(tenantCacheSalt(tenant)));
  }

  /**
   * The body the engine gets for `tenant`'s completion request: with its salt as the last
   * member. Unchanged without a tenant (no tenants configured).
   */
  apply(body: Buffer, tenant: Pick<TenantConfig, 'name'> | null | undefined): Buffer {
    if (!tenant) return body;
    const member = this.members.get(tenant.name);
    return member === undefined ? body : withCacheSalt(body, member);
  }
}

/** The salts for a configuration: none without tenants or with SLUICE_TENANT_CACHE_SALT=off. */
export function cacheSaltsFor(config: {
  tenants?: readonly TenantConfig[] | undefined;
  tenantCacheSalt: boolean;
}): CacheSalts | undefined {
  return config.tenants !== undefined && config.tenantCacheSalt
    ? new CacheSalts(config.tenants)
    : undefined;
}
