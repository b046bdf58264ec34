// Writes the simulator's /metrics the way vLLM's Python prometheus_client does
// (single-process mode): HELP/TYPE lines, `_total` counters with `_created` samples,
// histogram `_bucket`/`_count`/`_sum`/`_created`, labels in declaration order, and
// floats in Go notation (`1.0`, `+Inf`, `1.7643e+09`). prom-client writes a different
// dialect (no `_created`, integers without `.0`), which is why this is done by hand.

/** Python's repr() of a float, as prometheus_client's floatToGoString starts from it. */
function pythonRepr(value: number): string {
  const abs = Math.abs(value);
  if (abs !== 0 && (abs < 1e-4 || abs >= 1e16)) {
    const [mantissa, exponent] = value.toExponential().split('e') as [string, string];
    const sign = exponent.startsWith('-') ? '-' : '+';
    return `${mantissa}e${sign}${exponent.replace(/^[+-]/, '').padStart(2, '0')}`;
  }
  return Number.isInteger(value) ? `${value}.0` : String(value);
}

/** prometheus_client.utils.floatToGoString. */
export function goFloat(value: number): string {
  if (value === Number.POSITIVE_INFINITY) return '+Inf';
  if (value === Number.NEGATIVE_INFINITY) return '-Inf';
  if (Number.isNaN(value)) return 'NaN';
  const s = pythonRepr(value);
  const dot = s.indexOf('.');
  if (value > 0 && dot > 6) {
    const mantissa = `${s[0]}.${s.slice(1, dot)}${s.slice(dot + 1)}`.replace(/[0.]+$/, '');
    return `${mantissa}e+0${dot - 1}`;
  }
  return s;
}

function escapeLabel(value: string): string {
  return value.replace(/\\/g, '\\\\').replace(/\n/g, '\\n').replace(/"/g, '\\"');
}

/** Pre-rendered `{a="x",b="y"}` body (without braces) for a fixed label set. */
export function labelText(labels: ReadonlyArray<readonly [string, string]>): string {
  return labels.map(([k, v]) => `${k}="${escapeLabel(v)}"`).join(',');
}

export class Histogram {
  readonly counts: number[];
  sum = 0;
  count = 0;

  constructor(readonly bounds: readonly number[]) {
    this.counts = new Array<number>(bounds.length).fill(0);
  }

  observe(value: number): void {
    this.sum += value;
    this.count += 1;
    for (let i = 0; i < this.bounds.length; i += 1) {
      if (value <= this.bounds[i]!) this.counts[i]! += 1;
    }
  }
}

export class ExpositionWriter {
  private out = '';

  constructor(private readonly created: string) {}

  header(name: string, type: string, help: string): void {
    this.out += `# HELP ${name} ${help.replace(/\\/g, '\\\\').replace(/\n/g, '\\n')}\n# TYPE ${name} ${type}\n`;
  }

  gauge(name: string, help: string, labels: string, value: number): void {
    this.header(name, 'gauge', help);
    this.sample(name, labels, value);
  }

  /** `base` without `_total`; writes `base_total` and `base_created` like prometheus_client. */
  counter(base: string, help: string, series: ReadonlyArray<readonly [string, number]>): void {
    this.header(`${base}_total`, 'counter', help);
    for (const [labels, value] of series) {
      this.sample(`${base}_total`, labels, value);
      this.sample(`${base}_created`, labels, undefined);
    }
  }

  histogram(name: string, help: string, labels: string, h: Histogram): void {
    this.header(name, 'histogram', help);
    const prefix = labels === '' ? '' : `${labels},`;
    for (let i = 0; i < h.bounds.length; i += 1)
      this.sample(`${name}_bucket`, `${prefix}le="${goFloat(h.bounds[i]!)}"`, h.counts[i]!);
    this.sample(`${name}_bucket`, `${prefix}le="+Inf"`, h.count);
    this.sample(`${name}_count`, labels, h.count);
    this.sample(`${name}_sum`, labels, h.sum);
    this.sample(`${name}_created`, labels, undefined);
  }

  text(): string {
    return this.out;
  }

  /** `value` undefined writes the creation timestamp. */
  private sample(name: string, labels: string, value: number | undefined): void {
    const v = value === undefined ? this.created : goFloat(value);
    this.out += labels === '' ? `${name} ${v}\n` : `${name}{${labels}} ${v}\n`;
  }
}
