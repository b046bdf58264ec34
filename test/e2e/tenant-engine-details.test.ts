// What tenants learn of the engines. With tenants (and SLUICE_TENANT_ENGINE_DETAILS at its
// default, off) an answer carries no `x-sluice-engine`, and an engine failure is told in a fixed
// message, not the dispatcher's, which names the engine and undici's cause (an address); the
// access log keeps that one as `detail`. A second gateway with the switch on shows both. One
// pool has a live engine simulator, the other an engine address where nothing listens.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  answer,
  freePort,
  startGateway,
  startStack,
  untilReady,
  type SluiceProcess,
  type Stack,
  type TestEngineSim,
} from '../support/index.ts';

const KEY = 'sk-alpha-engine-details-5f0c1e9b7a2d4c6e8f10';

let stack: Stack;
let sim: TestEngineSim;
/** SLUICE_TENANT_ENGINE_DETAILS unset: off. */
let hidden: SluiceProcess;
/** SLUICE_TENANT_ENGINE_DETAILS=on. */
let shown: SluiceProcess;
let deadAddress: string;

beforeAll(async () => {
  deadAddress = `127.0.0.1:${await freePort()}`;
  stack = await startStack({
    config: ({ url }) =>
      [
        'tenants:',
        '  - name: alpha',
        `    apiKeys: [${KEY}]`,
        'pools:',
        '  - name: live',
        '    models: [m]',
        '    engines:',
        `      - { url: "${url}", maxInflight: 4 }`,
        '  - name: dead',
        '    models: [gone]',
        '    engines:',
        `      - { url: "http://${deadAddress}", maxInflight: 4 }`,
        '',
      ].join('\n'),
  });
  ({ sim, gateway: hidden } = stack);
  shown = await startGateway({ ...stack.env, SLUICE_TENANT_ENGINE_DETAILS: 'on' });
  await Promise.all([untilReady(hidden), untilReady(shown)]);
}, 90_000);

afterAll(async () => {
  await shown?.stop();
  await stack?.stop();
});

function complete(gateway: SluiceProcess, model: string, id: string) {
  return fetch(`${gateway.url}/v1/chat/completions`, {
    method: 'POST',
    headers: {
      'content-type': 'application/json',
      authorization: `Bearer ${KEY}`,
      'x-request-id': id,
    },
    body: JSON.stringify({ model, messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 }),
  });
}

describe('engine details and tenants', () => {
  it('names the engine that served a request only where SLUICE_TENANT_ENGINE_DETAILS is on', async () => {
    const quiet = await complete(hidden, 'm', 'details-served-hidden');
    expect(quiet.status).toBe(200);
    await quiet.text();
    expect(quiet.headers.get('x-sluice-engine')).toBeNull();
    expect(quiet.headers.get('x-sluice-load-state')).toBe('normal');
    const told = await complete(shown, 'm', 'details-served-shown');
    expect(told.status).toBe(200);
    await told.text();
    expect(told.headers.get('x-sluice-engine')).toBe(new URL(sim.url).host);
  });

  it("tells a tenant a fixed message for an unreachable engine, and logs the dispatcher's", async () => {
    const quiet = await answer(complete(hidden, 'gone', 'details-dead-hidden'));
    expect(quiet.status, quiet.body).toBe(503);
    expect(quiet.reason).toBe('engine_unreachable');
    expect(quiet.retryAfter).not.toBeNull();
    expect(quiet.body).not.toContain(deadAddress);
    expect(JSON.parse(quiet.body).error.message).toBe(
      'the engine could not be reached; retry later',
    );
    const line = await hidden.process.waitForLine(/"kind":"access","id":"details-dead-hidden"/);
    const logged = JSON.parse(line.input!) as { reason: string; detail: string };
    expect(logged.reason).toBe('engine_unreachable');
    expect(logged.detail).toContain(deadAddress);

    const told = await answer(complete(shown, 'gone', 'details-dead-shown'));
    expect(told.status, told.body).toBe(503);
    expect(JSON.parse(told.body).error.message).toContain(deadAddress);
  });
});
