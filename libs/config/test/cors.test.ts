// GATEWAY_CORS_*: vLLM's CORS flags (--allowed-origins, --allowed-methods, --allowed-headers,
// --allow-credentials; vllm/entrypoints/openai/cli_args.py) with their defaults, and what each
// accepts. The gateway's answers are pinned in apps/gateway/test/cors.test.ts.
import { describe, expect, it } from 'vitest';
import { loadConfig } from '../src/index.js';
import { VARIABLES } from '../src/variables.js';
import { envError } from './helpers.js';

describe('GATEWAY_CORS_*', () => {
  it("defaults to vLLM's: any origin, method and header, no credentials", () => {
    expect(loadConfig({}).cors).toEqual({
      allowedOrigins: '*',
      allowedMethods: '*',
      allowedHeaders: '*',
      allowCredentials: false,
    });
  });

  it('keeps origins as browsers send them in Origin, so an exact match works', () => {
    const { cors } = loadConfig({
      GATEWAY_CORS_ALLOWED_ORIGINS:
        'https://Chat.Example.com/,http://localhost:80,https://bücher.example',
    });
    expect(cors.allowedOrigins).toEqual([
      'https://chat.example.com',
      'http://localhost',
      'https://xn--bcher-kva.example',
    ]);
  });

  it('refuses `*` among origins (it would make the list moot), naming what is allowed', () => {
    const error = envError({ GATEWAY_CORS_ALLOWED_ORIGINS: 'https://a.example, *' });
    expect(error.variable).toBe('GATEWAY_CORS_ALLOWED_ORIGINS');
    expect(error.message).toBe(
      `GATEWAY_CORS_ALLOWED_ORIGINS="https://a.example, *" is invalid: expected ${VARIABLES.GATEWAY_CORS_ALLOWED_ORIGINS.allowed}`,
    );
    expect(error.message).toContain('* (any origin), none, or a comma-separated list of origins');
  });

  it('refuses a path, which no Origin header has, and hides credentials written into one', () => {
    expect(envError({ GATEWAY_CORS_ALLOWED_ORIGINS: 'https://a.example/app' }).variable).toBe(
      'GATEWAY_CORS_ALLOWED_ORIGINS',
    );
    const error = envError({ GATEWAY_CORS_ALLOWED_ORIGINS: 'https://u:s3cret@a.example' });
    expect(error.message).not.toContain('s3cret');
  });

  it('takes methods in upper case only: a preflight compares them exactly', () => {
    expect(envError({ GATEWAY_CORS_ALLOWED_METHODS: 'GET,post' }).message).toMatch(
      /^GATEWAY_CORS_ALLOWED_METHODS="GET,post" is invalid: expected .*upper-case methods/,
    );
  });

  it('refuses a header named twice in different cases', () => {
    expect(envError({ GATEWAY_CORS_ALLOWED_HEADERS: 'Authorization,authorization' }).variable).toBe(
      'GATEWAY_CORS_ALLOWED_HEADERS',
    );
  });

  it('accepts credentials with any origin, as Starlette does (it echoes the origin then)', () => {
    expect(
      loadConfig({ GATEWAY_CORS_ALLOW_CREDENTIALS: 'on', GATEWAY_CORS_ALLOWED_ORIGINS: '*' }).cors,
    ).toMatchObject({ allowedOrigins: '*', allowCredentials: true });
  });
});
