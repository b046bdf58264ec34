// Every degradation profile Sluice ships, or shows in an example, is exercised: its
// threshold selects it, and its rewrite adds its instruction (to the first user message, as
// these requests have no system message) and scales max_tokens.
// Adding a profile without behaviour fails here.
import { readdirSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { defaultDegradation, loadConfig, type DegradationConfig } from '@sluice/config';
import { describe, expect, it } from 'vitest';
import { PoolLoad } from '../src/degrade.ts';

const examples = fileURLToPath(new URL('../../../libs/config/examples/', import.meta.url));

const configs: Array<[string, DegradationConfig]> = [['built-in defaults', defaultDegradation]];
for (const file of readdirSync(examples).filter((f) => f.endsWith('.yaml')))
  for (const pool of loadConfig({ SLUICE_CONFIG: `${examples}${file}` }).pools)
    configs.push([`${file}, pool ${pool.name}`, pool.degradation]);

const cases = configs.flatMap(([where, config]) =>
  config.profiles.map((profile, index) => ({ where, config, profile, index })),
);

/** Drives a pool's load into a profile by feeding its threshold as the signal. */
function loadAt(config: DegradationConfig, level: number): PoolLoad {
  const load = new PoolLoad(config);
  for (let i = 0; i < 50; i += 1)
    load.update({ kvUsage: level, gpuUtilization: level, queuePressure: level });
  return load;
}

const chat = (maxTokens: number) =>
  JSON.stringify({
    model: 'm',
    messages: [{ role: 'user', content: 'Explain "admission" in one line.' }],
    max_tokens: maxTokens,
    stream: true,
  });

describe('every shipped degradation profile', () => {
  it('covers the built-in defaults and every example file', () => {
    expect(configs.length).toBeGreaterThanOrEqual(2);
    expect(cases.map((c) => c.profile.name)).toEqual(
      expect.arrayContaining(['normal', 'tired', 'lazy']),
    );
  });

  it.each(cases.map((c) => [`${c.where}: ${c.profile.name}`, c] as const))(
    '%s',
    (_name, { config, profile, index }) => {
      const load = loadAt(config, profile.threshold);
      const result = load.apply(chat(100), '/v1/chat/completions', false);
      if (!config.enabled) {
        expect(result).toEqual({
          body: chat(100),
          state: config.profiles[0]!.name,
          degraded: false,
        });
        return;
      }
      expect(load.profile).toBe(profile.name);
      expect(result.state).toBe(profile.name);
      if (index === 0) {
        // The lowest profile leaves the body byte for byte as the client sent it.
        expect(result.degraded).toBe(false);
        expect(result.body).toBe(chat(100));
        return;
      }
      expect(result.degraded).toBe(true);
      // The body as the job carries it from a gateway (bytes) is rewritten the same way.
      expect(load.apply(Buffer.from(chat(100)), '/v1/chat/completions', false)).toEqual(result);
      const sent = JSON.parse(result.body.toString()) as {
        messages: Array<{ role: string; content: string }>;
        max_tokens: number;
        stream: boolean;
      };
      expect(sent.max_tokens).toBe(
        Math.max(config.minMaxTokens, Math.min(100, Math.round(100 * profile.maxTokensFactor))),
      );
      // No message is added: a chat template that refuses a system role (Gemma) still renders it.
      expect(sent.messages).toEqual([
        {
          role: 'user',
          content:
            profile.instruction === undefined
              ? 'Explain "admission" in one line.'
              : `${profile.instruction}\n\nExplain "admission" in one line.`,
        },
      ]);
      expect(sent.stream).toBe(true);
    },
  );

  it('honours x-sluice-degrade: off only where the pool allows it', () => {
    const lazy = defaultDegradation.profiles.at(-1)!;
    expect(
      loadAt(defaultDegradation, lazy.threshold).apply(chat(100), '/v1/chat/completions', true)
        .degraded,
    ).toBe(true);
    const allowing = { ...defaultDegradation, allowOptOut: true };
    expect(loadAt(allowing, lazy.threshold).apply(chat(100), '/v1/chat/completions', true)).toEqual(
      { body: chat(100), state: 'normal', degraded: false },
    );
  });
});

describe('the rewrite under the lazy profile, as vLLM will read it', () => {
  const lazy = defaultDegradation.profiles.find((p) => p.name === 'lazy')!;
  const apply = (body: object, path: '/v1/chat/completions' | '/v1/completions') =>
    JSON.parse(
      loadAt(defaultDegradation, lazy.threshold)
        .apply(JSON.stringify(body), path, false)
        .body.toString(),
    ) as Record<string, unknown>;

  it("completions without max_tokens keep vLLM's default of 16: no 0.3 x 1024 = 307", () => {
    const sent = apply({ model: 'm', prompt: 'Once upon' }, '/v1/completions');
    expect(sent.max_tokens).toBeUndefined();
    expect(sent.prompt).toBe(`${lazy.instruction}\n\nOnce upon`);
    // an explicit null is the rest of the context in vLLM: it stays so
    expect(
      apply({ model: 'm', prompt: 'p', max_tokens: null }, '/v1/completions').max_tokens,
    ).toBeNull();
  });

  it('never adds a limit to a request vLLM runs to the end of the context window', () => {
    // vLLM refuses prompt + max_tokens > max_model_len with a 400; without a limit the same
    // long prompt gets the rest of the window. Adding one would fail it only under load.
    const messages = [{ role: 'user', content: 'a long document ...' }];
    for (const extra of [{}, { max_tokens: null }, { max_completion_tokens: null }]) {
      const sent = apply({ model: 'm', messages, ...extra }, '/v1/chat/completions');
      expect(sent.max_tokens ?? null).toBeNull();
      expect(sent.max_completion_tokens ?? null).toBeNull();
      expect(sent.messages).toEqual([
        { role: 'user', content: `${lazy.instruction}\n\na long document ...` },
      ]);
    }
  });

  it('joins a leading system message, and never adds a message of its own', () => {
    const sent = apply(
      {
        model: 'm',
        messages: [
          { role: 'system', content: 'You are terse.' },
          { role: 'user', content: 'hi' },
        ],
        max_tokens: 100,
      },
      '/v1/chat/completions',
    );
    expect(sent.messages).toEqual([
      { role: 'system', content: `${lazy.instruction}\n\nYou are terse.` },
      { role: 'user', content: 'hi' },
    ]);
  });

  it('leaves the limits of a grammar-constrained request alone', () => {
    // A cut JSON answer or tool call is invalid, not shorter.
    const messages = [{ role: 'user', content: 'hi' }];
    for (const extra of [
      { tool_choice: 'required' },
      { tool_choice: { type: 'function', function: { name: 'f' } } },
      { response_format: { type: 'json_schema', json_schema: { name: 'x', schema: {} } } },
      { response_format: { type: 'json_object' } },
      { guided_json: { type: 'object' } },
      { guided_regex: '[0-9]+' },
      { guided_choice: ['a', 'b'] },
      { guided_grammar: 'root ::= "a"' },
      { structured_outputs: { choice: ['a', 'b'] } },
    ]) {
      const sent = apply(
        { model: 'm', messages, max_tokens: 100, max_completion_tokens: 200, ...extra },
        '/v1/chat/completions',
      );
      expect([sent.max_tokens, sent.max_completion_tokens]).toEqual([100, 200]);
      expect((sent.messages as Array<{ content: string }>)[0]!.content).toBe(
        `${lazy.instruction}\n\nhi`,
      );
    }
    // tool_choice auto is no constraint: scaled
    expect(
      apply({ model: 'm', messages, max_tokens: 100, tool_choice: 'auto' }, '/v1/chat/completions')
        .max_tokens,
    ).toBe(30);
  });

  it('never scales below min_tokens, which vLLM requires to be <= max_tokens', () => {
    const messages = [{ role: 'user', content: 'hi' }];
    expect(
      apply({ model: 'm', messages, min_tokens: 500, max_tokens: 1000 }, '/v1/chat/completions')
        .max_tokens,
    ).toBe(500);
    // no limit sent: none added, min_tokens or not
    expect(
      apply({ model: 'm', messages, min_tokens: 500 }, '/v1/chat/completions').max_tokens,
    ).toBeUndefined();
  });

  it('does not prefix a completions prompt that vLLM echoes back, and still scales', () => {
    const sent = apply(
      { model: 'm', prompt: 'Once upon', echo: true, max_tokens: 100 },
      '/v1/completions',
    );
    expect(sent.prompt).toBe('Once upon');
    expect(sent.max_tokens).toBe(30);
  });
});
