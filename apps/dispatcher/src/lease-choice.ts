// Which pools a dispatcher contends for, given SLUICE_POOLS and SLUICE_MAX_LEASED_POOLS. Pure:
// the lease mechanics (lease.ts) ask before each attempt to take a lease they do not hold.
//
// Fairness: a dispatcher below its limit contends for every allowed pool it does not lead; one
// at its limit contends for none (it keeps renewing its own and stands by for the rest). So with
// two dispatchers of limit 1 and two pools, the first to take a pool stops contending and the
// other takes the second pool; none ends with both while another sits idle. An attempt in
// flight counts against the limit like a lease held: attempts for several pools at once could
// otherwise all succeed and overshoot it.

export interface LeaseChoice {
  /** The pools this dispatcher may lead (SLUICE_POOLS, or every configured pool). */
  allowed: readonly string[];
  /** The pools it leads now. */
  leading: ReadonlySet<string>;
  /** The pools whose lease it is trying to take right now (an attempt in flight). */
  trying: ReadonlySet<string>;
  /** SLUICE_MAX_LEASED_POOLS; undefined: no limit. */
  limit: number | undefined;
}

/** The configured pools this dispatcher may lead, in config order; `allowed` undefined: all. */
export function allowedPools<P extends { name: string }>(
  pools: readonly P[],
  allowed: readonly string[] | undefined,
): P[] {
  return allowed === undefined ? [...pools] : pools.filter((p) => allowed.includes(p.name));
}

/** The pools it may try to take the lease of now: none at its limit, else every free allowed one. */
export function poolsToContend({ allowed, leading, trying, limit }: LeaseChoice): string[] {
  if (limit !== undefined && leading.size + trying.size >= limit) return [];
  return allowed.filter((pool) => !leading.has(pool) && !trying.has(pool));
}
