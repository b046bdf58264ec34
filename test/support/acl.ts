// A redis-server (no requirepass) with one ACL user made from the rule line an operator is told
// to use: the `ACL SETUSER` line in docs/redis.md between `<!-- acl:start -->` and
// `<!-- acl:end -->`, so a test that serves through this user proves the documentation.
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { repoRoot } from './engine-sim.ts';
import { startRedis, type TestRedis } from './redis.ts';

export const aclDocFile = join(repoRoot, 'docs', 'redis.md');

/**
 * The rule until docs/redis.md carries one: the key and channel prefix `sluice:` (every
 * Sluice key and BullMQ's, whatever the hash tag), every command but the dangerous ones, and
 * the few dangerous ones Sluice and BullMQ call (INFO for BullMQ's version check, KEYS and
 * MEMORY USAGE for `sluice status`, CLIENT LIST for BullMQ's worker list).
 */
export const fallbackAclRule =
  'ACL SETUSER sluice on >CHANGE-ME resetkeys ~sluice:* resetchannels &sluice:* ' +
  '+@all -@dangerous +info +keys +memory|usage +client|list +client|info';

/** The documented `ACL SETUSER` line, or the fallback when docs/redis.md does not exist yet. */
export function documentedAclRule(file = aclDocFile): string {
  if (!existsSync(file)) return fallbackAclRule;
  const text = readFileSync(file, 'utf8');
  const block = /<!-- acl:start -->([\s\S]*?)<!-- acl:end -->/.exec(text)?.[1];
  const line = block && /ACL SETUSER\s+[^\n`]+/i.exec(block)?.[0];
  if (!line) throw new Error(`${file} has no ACL SETUSER line between acl:start and acl:end`);
  return line.trim();
}

/**
 * The arguments of `ACL SETUSER` for `rule` with its password placeholder(s) replaced by
 * `password`: the user's name, then every rule.
 */
export function aclArguments(rule: string, password: string): { user: string; rules: string[] } {
  const [acl, setuser, user, ...rest] = rule.split(/\s+/);
  if (acl?.toUpperCase() !== 'ACL' || setuser?.toUpperCase() !== 'SETUSER' || !user)
    throw new Error(`not an ACL SETUSER line: ${rule}`);
  const rules = rest.filter((r) => !/^[>#<!]/.test(r) && r !== 'nopass');
  return { user, rules: [...rules, `>${password}`] };
}

export interface TestAclRedis {
  readonly redis: TestRedis;
  readonly username: string;
  readonly password: string;
  /** `redis://<user>:<password>@127.0.0.1:<port>`. */
  readonly url: string;
  /** The environment that points Sluice at this server as the ACL user. */
  readonly env: Record<string, string>;
  stop(): Promise<void>;
}

/** A redis-server whose ACL user has exactly the documented rules, with `password`. */
export async function startAclRedis(
  options: { rule?: string; password?: string } = {},
): Promise<TestAclRedis> {
  const password = options.password ?? 'acl-test-password';
  const { user, rules } = aclArguments(options.rule ?? documentedAclRule(), password);
  const redis = await startRedis();
  try {
    const admin = new Redis(redis.url);
    try {
      await admin.call('ACL', 'SETUSER', user, 'reset', ...rules);
    } finally {
      admin.disconnect();
    }
  } catch (err) {
    await redis.stop();
    throw err;
  }
  const url = `redis://${encodeURIComponent(user)}:${encodeURIComponent(password)}@127.0.0.1:${redis.port}`;
  return {
    redis,
    username: user,
    password,
    url,
    env: { REDIS_URL: url },
    stop: () => redis.stop(),
  };
}
