import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { describeVariables } from '../src/index.js';
import { VARIABLES } from '../src/variables.js';

const readme = readFileSync(new URL('../README.md', import.meta.url), 'utf8');

describe('README', () => {
  it('embeds the describeVariables() table verbatim (regenerate it when this fails)', () => {
    const between = /<!-- variables:start -->\n([\s\S]*?)\n<!-- variables:end -->/.exec(readme);
    expect(between?.[1]).toBe(describeVariables());
  });

  it('mentions every variable', () => {
    for (const name of Object.keys(VARIABLES)) expect(readme).toContain(`\`${name}\``);
  });

  it('shows the exported functions', () => {
    for (const name of [
      'loadConfig',
      'describeVariables',
      'createRouter',
      'poolForModel',
      'passthroughForModel',
      'withDiscoveredModels',
      'ConfigError',
    ])
      expect(readme).toContain(name);
  });
});
