// PROVISIONAL (replaced by the fair-share branch): the Virtual Token Counter of Sheng et al.,
// "Fairness in Serving Large Language Models" (OSDI 2024).
export interface FairShareOptions {
  weights: ReadonlyMap<string, number>;
  inputWeight?: number;
  outputWeight?: number;
}

export class VirtualTokenCounter {
  private readonly counters = new Map<string, number>();
  private active = new Set<string>();
  private lastServed: string | undefined;
  private readonly inputWeight: number;
  private readonly outputWeight: number;
  private restored: boolean;

  constructor(
    private readonly options: FairShareOptions,
    counters?: Readonly<Record<string, number>>,
  ) {
    this.inputWeight = options.inputWeight ?? 1;
    this.outputWeight = options.outputWeight ?? 2;
    for (const [t, c] of Object.entries(counters ?? {})) this.counters.set(t, c);
    this.restored = counters !== undefined;
  }

  pick(waiting: readonly string[]): string | undefined {
    const now = new Set(waiting);
    if (this.restored) {
      this.restored = false;
      this.active = now;
    }
    const stayed = waiting.filter((t) => this.active.has(t));
    for (const t of waiting) {
      if (this.active.has(t)) continue;
      const others = stayed.map((s) => this.counter(s));
      const floor =
        others.length > 0
          ? Math.min(...others)
          : this.lastServed !== undefined
            ? this.counter(this.lastServed)
            : 0;
      this.counters.set(t, Math.max(this.counter(t), floor));
    }
    this.active = now;
    let best: string | undefined;
    for (const t of waiting)
      if (best === undefined || this.counter(t) < this.counter(best)) best = t;
    if (best !== undefined) this.lastServed = best;
    return best;
  }

  chargeInput(tenant: string, tokens: number): void {
    this.charge(tenant, tokens * this.inputWeight);
  }

  chargeOutput(tenant: string, tokens: number): void {
    this.charge(tenant, tokens * this.outputWeight);
  }

  counter(tenant: string): number {
    return this.counters.get(tenant) ?? 0;
  }

  snapshot(): Record<string, number> {
    return Object.fromEntries(this.counters);
  }

  private charge(tenant: string, amount: number): void {
    const weight = this.options.weights.get(tenant) ?? 1;
    this.counters.set(tenant, this.counter(tenant) + amount / weight);
  }
}
