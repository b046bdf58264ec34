// Wrong API keys per client address (GATEWAY_AUTH_FAILURE_*): an address that presented
// `limit` wrong keys within `windowMs` of its first one gets 429 `auth_throttled` until that
// window ends, its key not checked (auth.ts), so key guessing is bounded by the limit, not by
// how fast the gateway answers 401s. Only a key that was presented and is no tenant's counts:
// a request without a key, or with a malformed header, guesses nothing.
//
// In-process, per replica: N replicas behind a balancer allow N times the attempts, and a
// restart forgets. Chosen over a count in Redis: no round trip, and no Redis dependency, on
// the path that refuses strangers; the bound stays linear in replicas, which an operator sets.
//
// Not @fastify/rate-limit: it counts every request that passes its hook (there is no option
// to count only failures) and its count happens before the route knows the outcome, so every
// successful request would pay a store increment and carry rate-limit headers. Here a request
// with a right key costs one Map lookup (none while no address has failed), and is never slowed.
import ipaddr from 'ipaddr.js';

/** The client addresses counted as one: an IPv4 address, or an IPv6 /64 (one host's share). */
export function clientKey(address: string): string {
  if (!address.includes(':')) return address.slice(0, 64);
  // Parsed by ipaddr.js (what Fastify's trustProxy, through proxy-addr, parses addresses with):
  // zone ids, `::` and embedded IPv4 included. Anything else is kept as it came, bounded.
  if (!ipaddr.IPv6.isValid(address)) return address.slice(0, 64);
  const parsed = ipaddr.IPv6.parse(address);
  if (parsed.isIPv4MappedAddress()) return parsed.toIPv4Address().toString();
  // A client with a /64 (the usual share of one host or home) holds 2^64 addresses: counted
  // one by one, it would never be throttled.
  return `${parsed.parts
    .slice(0, 4)
    .map((part) => part.toString(16))
    .join(':')}::/64`;
}

export interface AuthThrottleOptions {
  /** Wrong keys per window before the address is refused (>= 1). */
  limit: number;
  windowMs: number;
  /** Addresses counted at once; past it the one whose window started first is dropped. */
  maxAddresses: number;
}

interface Window {
  /** When the address's first wrong key of this window came. */
  readonly start: number;
  failures: number;
}

export class AuthThrottle {
  /**
   * Address key → its current window, in the order the windows started (a new window is
   * re-inserted at the end), so the first entries are the oldest: expired ones are dropped
   * from the front, and at the cap the oldest goes.
   */
  private readonly windows = new Map<string, Window>();

  /** `now` in milliseconds, monotonic (performance.now in the gateway). */
  constructor(
    private readonly options: AuthThrottleOptions,
    private readonly now: () => number,
  ) {}

  /** Addresses counted now (for tests and the bound). */
  get size(): number {
    return this.windows.size;
  }

  /**
   * Whole seconds until `address` may present a key again (at least 1), or 0 when it may now.
   * One Map lookup, none while no address has a wrong key counted.
   */
  retryAfter(address: string): number {
    if (this.windows.size === 0) return 0;
    const window = this.windows.get(clientKey(address));
    if (window === undefined || window.failures < this.options.limit) return 0;
    const left = window.start + this.options.windowMs - this.now();
    return left > 0 ? Math.ceil(left / 1000) : 0;
  }

  /** Counts one wrong key from `address`. */
  failed(address: string): void {
    const now = this.now();
    this.expire(now);
    const key = clientKey(address);
    const window = this.windows.get(key);
    if (window !== undefined) {
      if (now < window.start + this.options.windowMs) {
        window.failures += 1;
        return;
      }
      this.windows.delete(key);
    } else if (this.windows.size >= this.options.maxAddresses) {
      const oldest = this.windows.keys().next();
      if (!oldest.done) this.windows.delete(oldest.value);
    }
    this.windows.set(key, { start: now, failures: 1 });
  }

  /** Drops the windows that have ended, oldest first, up to the first that has not. */
  private expire(now: number): void {
    for (const [key, window] of this.windows) {
      if (now < window.start + this.options.windowMs) return;
      this.windows.delete(key);
    }
  }
}
