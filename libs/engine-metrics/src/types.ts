/** Metric types a `# TYPE` line may declare (0.0.4 types plus the OpenMetrics ones). */
export type MetricType =
  | 'counter'
  | 'gauge'
  | 'histogram'
  | 'summary'
  | 'untyped'
  | 'info'
  | 'stateset'
  | 'gaugehistogram'
  | 'unknown';

/** What the `# TYPE` and `# HELP` lines said about one metric family. */
export interface MetricFamily {
  readonly name: string;
  /** `'untyped'` when the family only had a HELP line. */
  readonly type: MetricType;
  /** Unescaped help text; absent when there was no HELP line. */
  readonly help?: string;
}

/** Label name to label value. Plain object; do not mutate (samples may share one). */
export type Labels = Readonly<Record<string, string>>;

/** One sample line, exactly as written: `_bucket`, `_sum`, `_created`… are ordinary samples. */
export interface Sample {
  readonly name: string;
  readonly labels: Labels;
  readonly value: number;
  /** Milliseconds since the epoch; present only when the line carried a timestamp. */
  readonly timestamp?: number;
}

export interface Exposition {
  /** Every sample line, in input order. */
  readonly samples: readonly Sample[];
  /** Families declared by TYPE or HELP lines, keyed by the name on those lines. */
  readonly families: ReadonlyMap<string, MetricFamily>;
}
