/**
 * Thrown for any configuration value that is not allowed. The message is one line that
 * names the variable (or the YAML path), shows the value and says what is allowed, e.g.
 * `ADMISSION_KV_THRESHOLD="1.5" is invalid: expected a number > 0 and <= 1`.
 */
export class ConfigError extends Error {
  readonly code = 'ERR_SLUICE_CONFIG';
  /** The environment variable, or the path inside the YAML file (`pools[0].engines[1].url`). */
  readonly variable: string;

  constructor(variable: string, message: string) {
    super(message);
    this.name = 'ConfigError';
    this.variable = variable;
  }
}

const MAX_SHOWN = 120;

/**
 * A value as it appears in a message: JSON (so quotes and blanks are visible), one line, capped.
 * `replacer` is JSON.stringify's: it may hide parts of a structured value.
 */
export function show(
  value: unknown,
  replacer?: (this: unknown, key: string, value: unknown) => unknown,
): string {
  let text: string;
  try {
    text = JSON.stringify(value, replacer) ?? String(value);
  } catch {
    text = String(value);
  }
  return text.length > MAX_SHOWN ? `${text.slice(0, MAX_SHOWN)}…` : text;
}

/**
 * How a secret appears in a message: never its characters, only its length, or only its kind
 * when it is not a scalar (a key written as a list or a mapping still holds the key).
 */
export function hidden(value: unknown): string {
  if (value === null || value === undefined) return '(hidden, empty)';
  if (Array.isArray(value)) return '(hidden, a list)';
  if (typeof value === 'object') return '(hidden, a mapping)';
  return `(hidden, ${String(value).length} characters)`;
}

/** `NAME=<shown value> is invalid: expected <allowed>`. */
export function invalid(variable: string, shown: string, allowed: string): ConfigError {
  return new ConfigError(variable, `${variable}=${shown} is invalid: expected ${allowed}`);
}
