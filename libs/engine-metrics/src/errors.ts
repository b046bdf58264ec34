/** Thrown for any input that is not valid text exposition format 0.0.4. */
export class PrometheusParseError extends Error {
  readonly code = 'ERR_PROM_PARSE';
  /** 1-based line number of the offending line. */
  readonly line: number;

  constructor(line: number, detail: string) {
    super(`line ${line}: ${detail}`);
    this.name = 'PrometheusParseError';
    this.line = line;
  }
}
