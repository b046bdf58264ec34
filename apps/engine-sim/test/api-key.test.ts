// `--api-key`, as vLLM: the simulator as a real process, asked over HTTP with and without
// the key; refused requests reach no engine and are counted.
import { startEngineSim, type TestEngineSim } from '@sluice/test/support';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseSimOptions } from '../src/options.ts';

const KEY = 'engine-secret-1';
let sim: TestEngineSim;

beforeAll(async () => {
  sim = await startEngineSim(['--profile', 'instant', '--model', 'm', '--api-key', KEY]);
});
afterAll(async () => {
  await sim?.stop();
});

const complete = (headers: Record<string, string>) =>
  fetch(`${sim.url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify({ model: 'm', prompt: 'hi', max_tokens: 2 }),
  });

describe('engine-sim --api-key', () => {
  it('refuses /v1 requests without the right bearer key with 401 {"error":"Unauthorized"}', async () => {
    const before = await sim.state();
    const attempts: Record<string, string>[] = [
      {},
      { authorization: 'Bearer wrong' },
      { authorization: KEY },
      { authorization: `Basic ${KEY}` },
      // vLLM splits at the first space: a second one becomes part of the key.
      { authorization: `Bearer  ${KEY}` },
    ];
    for (const headers of attempts) {
      const res = await complete(headers);
      expect(res.status, JSON.stringify(headers)).toBe(401);
      expect(await res.json()).toEqual({ error: 'Unauthorized' });
    }
    expect((await fetch(`${sim.url}/v1/models`)).status).toBe(401);
    const after = await sim.state();
    expect(after['receivedTotal']).toBe(before['receivedTotal']);
    expect(after['unauthorizedTotal']).toBe(Number(before['unauthorizedTotal']) + 6);
    await sim.process.waitForLine(/request refused: missing or wrong api key/);
    expect(sim.process.output.join('\n')).not.toContain(KEY);
  });

  it('serves the right key, with any case of the scheme', async () => {
    const before = await sim.state();
    for (const scheme of ['Bearer', 'bearer']) {
      const res = await complete({ authorization: `${scheme} ${KEY}` });
      expect(res.status).toBe(200);
      expect(((await res.json()) as { object: string }).object).toBe('text_completion');
    }
    expect((await sim.state())['receivedTotal']).toBe(Number(before['receivedTotal']) + 2);
  });

  it('leaves /health, /metrics and /sim open, as vLLM guards only its API prefixes', async () => {
    for (const path of ['/health', '/metrics', '/sim/state'])
      expect((await fetch(`${sim.url}${path}`)).status, path).toBe(200);
  });
});

describe('the option', () => {
  it('comes from --api-key or VLLM_API_KEY, is unset by default, and is never shown', () => {
    expect(parseSimOptions([], {}).apiKey).toBeUndefined();
    expect(parseSimOptions([], { VLLM_API_KEY: 'k1' }).apiKey).toBe('k1');
    expect(parseSimOptions(['--api-key', 'k2'], { VLLM_API_KEY: 'k1' }).apiKey).toBe('k2');
    expect(() => parseSimOptions(['--api-key', 'my secret'], {})).toThrow(
      '--api-key=(hidden, 9 characters) is invalid: expected visible ASCII characters (no blanks)',
    );
  });
});
