import { expect } from 'vitest';
import { ConfigError, loadConfig, type SluiceConfig } from '../src/index.js';

export type Env = Record<string, string | undefined>;

/** A readFile that serves these files and fails like fs for any other path. */
export function files(contents: Record<string, string>): (path: string) => string {
  return (path) => {
    const text = contents[path];
    if (text === undefined)
      throw Object.assign(new Error(`ENOENT: no such file or directory, open '${path}'`), {
        code: 'ENOENT',
      });
    return text;
  };
}

/** Loads with one YAML file at /etc/sluice.yaml. */
export function loadFile(yaml: string, env: Env = {}): SluiceConfig {
  return loadConfig(
    { SLUICE_CONFIG: '/etc/sluice.yaml', ...env },
    files({ '/etc/sluice.yaml': yaml }),
  );
}

/** Runs `fn`, expects a ConfigError, checks its invariants and returns it. */
export function configError(fn: () => unknown): ConfigError {
  let caught: unknown;
  try {
    fn();
  } catch (error) {
    caught = error;
  }
  expect(caught).toBeInstanceOf(ConfigError);
  const error = caught as ConfigError;
  expect(error.code).toBe('ERR_SLUICE_CONFIG');
  expect(error.name).toBe('ConfigError');
  expect(error.message).not.toMatch(/[\r\n]/);
  return error;
}

export const envError = (env: Env) => configError(() => loadConfig(env));
export const fileError = (yaml: string, env: Env = {}) => configError(() => loadFile(yaml, env));
