// What a value may be, defined once and used both for environment variables (text) and for
// the YAML file (typed values), so `VLLM_MAX_QUEUE_DEPTH` and `pools[0].queueDepth` can never
// accept different things.

export interface Rule<T> {
  /** Completes the sentence "expected …" in an error message and the README table. */
  readonly allowed: string;
  /** Parses an environment value; `undefined` when it is not allowed. */
  readonly fromText: (raw: string) => T | undefined;
  /** Checks a value read from the YAML file; `undefined` when it is not allowed. */
  readonly fromValue: (value: unknown) => T | undefined;
}

/** Longest delay Node's timers honour; a larger one silently fires after 1 ms. */
export const MAX_TIMER_MS = 2_147_483_647;

const INTEGER_TEXT = /^-?\d+$/;
const DECIMAL_TEXT = /^-?(\d+\.?\d*|\.\d+)(e[+-]?\d+)?$/i;

function textOnly<T>(fromText: (raw: string) => T | undefined) {
  return (value: unknown) => (typeof value === 'string' ? fromText(value) : undefined);
}

/** Whole numbers written in decimal digits: no `1e3`, `0x10`, blanks or empty strings. */
export function integer(min: number, max: number = Number.MAX_SAFE_INTEGER): Rule<number> {
  const allowed =
    max === Number.MAX_SAFE_INTEGER ? `an integer >= ${min}` : `an integer from ${min} to ${max}`;
  const check = (n: number) =>
    Number.isSafeInteger(n) && n >= min && n <= max ? (Object.is(n, -0) ? 0 : n) : undefined;
  return {
    allowed,
    fromText: (raw) => (INTEGER_TEXT.test(raw) ? check(Number(raw)) : undefined),
    fromValue: (value) => (typeof value === 'number' ? check(value) : undefined),
  };
}

export interface DecimalBounds {
  min: number;
  /** Strictly greater than `min`. */
  exclusiveMin?: boolean;
  max?: number;
}

/** Finite decimal numbers (`0.9`, `.5`, `2e-1`); no `Infinity`, `NaN`, hex or blanks. */
export function decimal({ min, exclusiveMin = false, max }: DecimalBounds): Rule<number> {
  const low = exclusiveMin ? `> ${min}` : `>= ${min}`;
  const allowed =
    max === undefined
      ? `a number ${low}`
      : exclusiveMin
        ? `a number > ${min} and <= ${max}`
        : `a number from ${min} to ${max}`;
  const check = (n: number) =>
    Number.isFinite(n) && (exclusiveMin ? n > min : n >= min) && (max === undefined || n <= max)
      ? n
      : undefined;
  return {
    allowed,
    fromText: (raw) => (DECIMAL_TEXT.test(raw) ? check(Number(raw)) : undefined),
    fromValue: (value) => (typeof value === 'number' ? check(value) : undefined),
  };
}

/** One of a fixed set of words; case-insensitive, normalised to the listed spelling. */
export function oneOf<const T extends string>(values: readonly T[]): Rule<T> {
  const byLower = new Map(values.map((v) => [v.toLowerCase(), v]));
  const fromText = (raw: string) => byLower.get(raw.toLowerCase());
  return { allowed: `one of ${values.join(', ')}`, fromText, fromValue: textOnly(fromText) };
}

/** Text matching `pattern`, optionally normalised. */
export function matching(
  pattern: RegExp,
  allowed: string,
  normalise: (raw: string) => string = (raw) => raw,
): Rule<string> {
  const fromText = (raw: string) => (pattern.test(raw) ? normalise(raw) : undefined);
  return { allowed, fromText, fromValue: textOnly(fromText) };
}

function parseUrl(raw: string): URL | undefined {
  // The WHATWG parser quietly strips surrounding blanks and control characters; we do not.
  if (raw !== raw.trim() || /[\s\p{Cc}]/u.test(raw)) return undefined;
  try {
    return new URL(raw);
  } catch {
    return undefined;
  }
}

function isPlainHttp(url: URL, raw: string): boolean {
  return (
    (url.protocol === 'http:' || url.protocol === 'https:') &&
    url.hostname !== '' &&
    url.username === '' &&
    url.password === '' &&
    !raw.includes('?') &&
    !raw.includes('#')
  );
}

/**
 * An engine or backend origin: http(s), host, optional port, nothing else. No path (the
 * apps append `/v1/...` and `/metrics`, and undici's Pool takes an origin), no credentials
 * (use `apiKey`), no query. A trailing slash is dropped, as are a default port and upper
 * case in the host: `HTTP://VLLM-0:80/` becomes `http://vllm-0`.
 */
export function originUrl(): Rule<string> {
  const fromText = (raw: string) => {
    const url = parseUrl(raw);
    if (!url || !isPlainHttp(url, raw) || url.pathname !== '/') return undefined;
    return url.origin;
  };
  return {
    allowed:
      'an http:// or https:// origin without path, credentials or query, e.g. http://vllm-0:8000',
    fromText,
    fromValue: textOnly(fromText),
  };
}

/** A full http(s) URL of an endpoint (path kept as written), e.g. dcgm-exporter's /metrics. */
export function endpointUrl(example: string): Rule<string> {
  const fromText = (raw: string) => {
    const url = parseUrl(raw);
    return url && isPlainHttp(url, raw) ? url.href : undefined;
  };
  return {
    allowed: `an http:// or https:// URL without credentials or query, e.g. ${example}`,
    fromText,
    fromValue: textOnly(fromText),
  };
}

/**
 * `redis://` or `rediss://`, optional user and password, optional numeric database. No query:
 * ioredis reads its parameters as connection options over the ones each role sets
 * (`?commandTimeout=0` would lift the request path's bound), and `?password=` would be a
 * credential the masking of messages cannot know; a user, a password and TLS have their own
 * places (in the URL before the host, REDIS_USERNAME / REDIS_PASSWORD, `rediss://`).
 */
export function redisUrl(): Rule<string> {
  const fromText = (raw: string) => {
    const url = parseUrl(raw);
    if (!url || (url.protocol !== 'redis:' && url.protocol !== 'rediss:')) return undefined;
    if (url.hostname === '' || !/^(\/(\d+)?)?$/.test(url.pathname)) return undefined;
    if (raw.includes('?') || raw.includes('#')) return undefined;
    return raw; // as written: ioredis parses it again, and re-encoding could alter a password
  };
  return {
    allowed:
      'a redis:// or rediss:// URL such as redis://:password@host:6379/0, without a query (use REDIS_USERNAME, REDIS_PASSWORD, and rediss:// for TLS; see docs/redis.md)',
    fromText,
    fromValue: textOnly(fromText),
  };
}

/** One `host:port` of a Redis node or sentinel. */
export interface HostPort {
  host: string;
  port: number;
}

const HOST_PORT = /^(?:\[([0-9A-Fa-f:.]+)\]|([A-Za-z0-9._-]+)):(\d{1,5})$/;

/**
 * A comma-separated list of `host:port` (IPv6 in brackets: `[::1]:26379`), blanks around
 * the commas allowed, no duplicates.
 */
export function hostPortList(example: string): Rule<HostPort[]> {
  const fromText = (raw: string) => {
    const list: HostPort[] = [];
    for (const item of raw.split(',').map((part) => part.trim())) {
      const match = HOST_PORT.exec(item);
      const port = Number(match?.[3]);
      if (!match || port < 1 || port > 65535) return undefined;
      const host = match[1] ?? match[2]!;
      if (list.some((seen) => seen.host === host && seen.port === port)) return undefined;
      list.push({ host, port });
    }
    return list;
  };
  return {
    allowed: `a comma-separated list of host:port without duplicates, e.g. ${example}`,
    fromText,
    fromValue: textOnly(fromText),
  };
}

/**
 * A comma-separated list of names matching `pattern` (blanks around the commas allowed), at
 * least one, no duplicates.
 */
export function nameList(pattern: RegExp, allowed: string): Rule<string[]> {
  const fromText = (raw: string) => {
    const list = raw.split(',').map((part) => part.trim());
    if (list.some((name) => !pattern.test(name)) || new Set(list).size !== list.length)
      return undefined;
    return list;
  };
  return { allowed, fromText, fromValue: textOnly(fromText) };
}

/**
 * Masks whatever could be credentials in a URL-like string, for messages and logs:
 * `redis://:pw@host:6379/0` becomes `redis://***@host:6379/0`. Valid or not, what is hidden:
 * - everything between the scheme and the last `@`: the host follows the last one, and a
 *   password may itself hold `@`, `/`, `?` or `#` (`redis://:p@ss@host` logs in with `p@ss`);
 *   without a well-formed `scheme:/`, the whole text before it;
 * - a query or fragment (`?password=...`);
 * - after a scheme and a host, a port that is not a number and all that follows
 *   (`redis://:s3cret`, `redis://user:s3cret`: the `@host` forgotten).
 * What is left is a scheme, a host, a numeric port and a path.
 */
export function maskCredentials(raw: string): string {
  const scheme = /^[a-z][a-z0-9+.-]*:\/+/i.exec(raw)?.[0] ?? '';
  const afterScheme = raw.slice(scheme.length);
  const at = afterScheme.lastIndexOf('@');
  let rest = afterScheme.slice(at + 1);
  const query = rest.search(/[?#]/);
  if (query !== -1) rest = `${rest.slice(0, query + 1)}***`;
  const badPort = /^(?:\[[^\]]*\]|[^:/[\]]*):(?!\d*(?:[/?#]|$))/.exec(rest);
  if (scheme !== '' && badPort) rest = `${badPort[0]}***`;
  return `${scheme}${at === -1 ? '' : '***@'}${rest}`;
}

/** `maskCredentials` for each item of a comma-separated list (REDIS_SENTINELS, ...). */
export function maskListCredentials(raw: string): string {
  return raw.split(',').map(maskCredentials).join(',');
}

/** The name an engine gets when the file gives none: `host:port` of its URL. */
export function engineNameFromUrl(url: string): string {
  const parsed = new URL(url);
  const port = parsed.port || (parsed.protocol === 'https:' ? '443' : '80');
  return `${parsed.hostname}:${port}`;
}
