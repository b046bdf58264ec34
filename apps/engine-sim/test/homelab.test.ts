// The reference incident, replayed by the real simulator process at 100x speed.
import { parseExposition } from '@sluice/engine-metrics';
import { eventually, startEngineSim, type TestEngineSim } from '@sluice/test/support';
import { afterEach, describe, expect, it } from 'vitest';

function chat(sim: TestEngineSim, promptTokens: number, maxTokens: number) {
  return fetch(`${sim.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({
      model: 'reasoning',
      messages: [{ role: 'user', content: `p${promptTokens}` }],
      sim_prompt_tokens: promptTokens,
      max_tokens: maxTokens,
      ignore_eos: true,
    }),
  }).then((r) => r.json());
}

/** TTFT observations (simulated seconds) at or below `le`, from the engine's own histogram. */
function ttftAtMost(text: string, le: string): number {
  return parseExposition(text).samples.find(
    (s) => s.name === 'vllm:time_to_first_token_seconds_bucket' && s.labels['le'] === le,
  )!.value;
}

describe('homelab profile, time-scaled', () => {
  let sim: TestEngineSim | undefined;
  afterEach(() => sim?.stop());

  it('short prompts behind a 65k-token prompt wait ~2 simulated minutes for their first token (reference PR: a 65k prompt costs minutes of prefill and starves everything else)', async () => {
    sim = await startEngineSim(['--profile', 'homelab', '--time-scale', '100']);
    const long = chat(sim, 65536, 4);
    await eventually(
      async () => ((await sim!.state()).running === 1 ? true : undefined),
      'the long prompt to start',
    );
    const shorts = Array.from({ length: 3 }, () => chat(sim!, 200, 4));
    await Promise.all([long, ...shorts]);
    const metrics = await sim.metricsText();
    // Four first tokens, all after 80 s: the long prompt's ~125 s of prefill at 525 tok/s,
    // and the short ones queued behind it for nearly as long. (No upper bound: a stalled
    // test machine stretches simulated time at 100x, it never shortens it.)
    expect(ttftAtMost(metrics, '+Inf')).toBe(4);
    expect(ttftAtMost(metrics, '80.0')).toBe(0);
    const queue = parseExposition(metrics).samples.find(
      (s) => s.name === 'vllm:request_queue_time_seconds_bucket' && s.labels['le'] === '60.0',
    )!;
    expect(queue.value).toBe(1); // only the long prompt was scheduled within a minute of arriving
  });

  it('short prompts alone get their first token within seconds (at --time-scale 10)', async () => {
    sim = await startEngineSim(['--profile', 'homelab', '--time-scale', '10']);
    await Promise.all(Array.from({ length: 3 }, () => chat(sim!, 200, 4)));
    const metrics = await sim.metricsText();
    expect(ttftAtMost(metrics, '10.0')).toBe(3);
  });

  it('names KV usage vllm:gpu_cache_usage_perc with --legacy-kv-metric', async () => {
    sim = await startEngineSim(['--legacy-kv-metric']);
    const names = new Set(parseExposition(await sim.metricsText()).samples.map((s) => s.name));
    expect(names.has('vllm:gpu_cache_usage_perc')).toBe(true);
    expect(names.has('vllm:kv_cache_usage_perc')).toBe(false);
  });
});
