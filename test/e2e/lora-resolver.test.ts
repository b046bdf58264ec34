// LoRA adapters loaded on first use. A vLLM with VLLM_ALLOW_RUNTIME_LORA_UPDATING and a LoRA
// resolver plugin loads an adapter on the first request that names it; until then no
// `/v1/models` lists it, so Sluice cannot route it by name. A pool with `loraResolver: true`
// takes every named model routed nowhere else, gated like its other requests, and the engine
// (the simulator with --lora-resolver-adapters) loads it or answers its own 404. A gateway whose
// file lacks the key answers 404 model_not_found itself, and the adapter is never loaded.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  answer,
  startDispatcher,
  startEngineSim,
  startGateway,
  startRedis,
  untilReady,
  type SluiceProcess,
  type TestEngineSim,
  type TestRedis,
} from '../support/index.ts';

let redis: TestRedis;
let sim: TestEngineSim;
let dispatcher: SluiceProcess;
/** Its pool has `loraResolver: true`. */
let resolving: SluiceProcess;
/** The same pool without the key. */
let plain: SluiceProcess;
let dir: string;

const poolYaml = (resolver: boolean) =>
  [
    'pools:',
    '  - name: main',
    '    models: [base]',
    ...(resolver ? ['    loraResolver: true'] : []),
    '    engines:',
    `      - { url: "${sim.url}", maxInflight: 2 }`,
    '',
  ].join('\n');

beforeAll(async () => {
  redis = await startRedis();
  sim = await startEngineSim([
    '--profile',
    'instant',
    '--model',
    'base',
    '--lora-resolver-adapters',
    'customer-7,customer-8',
  ]);
  dir = mkdtempSync(join(tmpdir(), 'sluice-lora-resolver-'));
  const withKey = join(dir, 'resolving.yaml');
  const withoutKey = join(dir, 'plain.yaml');
  writeFileSync(withKey, poolYaml(true));
  writeFileSync(withoutKey, poolYaml(false));
  dispatcher = await startDispatcher({ REDIS_URL: redis.url, SLUICE_CONFIG: withKey });
  [resolving, plain] = await Promise.all([
    startGateway({ REDIS_URL: redis.url, SLUICE_CONFIG: withKey }),
    startGateway({ REDIS_URL: redis.url, SLUICE_CONFIG: withoutKey }),
  ]);
  await Promise.all([untilReady(resolving), untilReady(plain)]);
}, 90_000);

afterAll(async () => {
  await resolving?.stop();
  await plain?.stop();
  await dispatcher?.stop();
  await sim?.stop();
  await redis?.stop();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

function complete(gateway: SluiceProcess, model: string) {
  return answer(
    fetch(`${gateway.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model, messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 }),
    }),
  );
}

/** The model ids the engine itself lists. */
async function engineModels(): Promise<string[]> {
  const listed = (await (await fetch(`${sim.url}/v1/models`)).json()) as {
    data: { id: string }[];
  };
  return listed.data.map((m) => m.id);
}

describe('a pool whose engines resolve LoRA adapters on first use', () => {
  it('answers 404 model_not_found itself without loraResolver, and the engine loads nothing', async () => {
    const refused = await complete(plain, 'customer-8');
    expect(refused.status, refused.body).toBe(404);
    expect(refused.reason).toBe('model_not_found');
    expect(await engineModels()).toEqual(['base']);
  });

  it('sends a name routed nowhere to the engine, which loads the adapter and answers', async () => {
    const first = await complete(resolving, 'customer-7');
    expect(first.status, first.body).toBe(200);
    expect(JSON.parse(first.body).model).toBe('customer-7');
    expect(await engineModels()).toEqual(['base', 'customer-7']);
    const again = await complete(resolving, 'customer-7');
    expect(again.status, again.body).toBe(200);
  });

  it("passes on the engine's own 404 for a name no resolver finds", async () => {
    const missing = await complete(resolving, 'nobody-has-this');
    expect(missing.status, missing.body).toBe(404);
    // The engine's answer, not a refusal of Sluice's.
    expect(missing.reason).toBeNull();
    expect(JSON.parse(missing.body).error.message).toBe(
      'The model `nobody-has-this` does not exist.',
    );
  });
});
