// --metrics-per-step: the gauges as vLLM v1 publishes them, from the end of each step, and
// nothing refreshed while no step runs. After every request is aborted at once they keep
// showing the requests that are gone (vllm-project/vllm#22545, #29928); the step counter,
// vllm:iteration_tokens_total's count, stands still with them. The server runs in this process
// from the sources; streams decode slowly so that they are still running when their clients go.
import { parseExposition, readVllmState, type VllmState } from '@sluice/engine-metrics';
import { eventually } from '@sluice/test/support';
import { afterEach, describe, expect, it } from 'vitest';
import { parseSimOptions } from '../src/options.ts';
import { createEngineSim, type EngineSim } from '../src/server.ts';

const SLOW = ['--profile', 'instant', '--model', 'm', '--decode-seconds-per-sequence', '0.01'];

const running: EngineSim[] = [];
afterEach(async () => {
  for (const sim of running.splice(0)) await sim.close();
});

async function start(args: string[]) {
  const sim = createEngineSim(parseSimOptions(['--port', '0', ...args], {}));
  running.push(sim);
  const url = await sim.app.listen({ host: '127.0.0.1', port: 0 });
  const state = async () =>
    (await (await fetch(`${url}/sim/state`)).json()) as {
      running: number;
      waiting: number;
      usedBlocks: number;
      abortsPending: number;
      peakRequests: number;
      simSeconds: number;
    };
  const metrics = async (): Promise<VllmState> =>
    readVllmState(parseExposition(await (await fetch(`${url}/metrics`)).text()));
  const faults = (patch: Record<string, unknown>) =>
    fetch(`${url}/sim/faults`, {
      method: 'PUT',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(patch),
    });
  /** `count` endless streams, each read to its first token. */
  const streams = async (count: number, signal: AbortSignal) => {
    const all = await Promise.all(
      Array.from({ length: count }, (_, i) =>
        fetch(`${url}/v1/chat/completions`, {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify({
            model: 'm',
            messages: [{ role: 'user', content: `stream ${i}` }],
            max_tokens: 100_000,
            ignore_eos: true,
            stream: true,
          }),
          signal,
        }),
      ),
    );
    await Promise.all(all.map((res) => res.body!.getReader().read()));
  };
  return { sim, url, state, metrics, faults, streams };
}

describe('--metrics-per-step', () => {
  it('is off by default, and read from the flag or SIM_METRICS_PER_STEP', () => {
    expect(parseSimOptions([], {}).metricsPerStep).toBe(false);
    expect(parseSimOptions(['--metrics-per-step'], {}).metricsPerStep).toBe(true);
    expect(parseSimOptions([], { SIM_METRICS_PER_STEP: '1' }).metricsPerStep).toBe(true);
  });

  it('keeps showing requests whose clients all left together, with the step counter still, until a step runs', async () => {
    const sim = await start([...SLOW, '--metrics-per-step']);
    const gone = new AbortController();
    await sim.streams(4, gone.signal);
    // Held, no step ends: the four aborts all wait for the step in flight, as vLLM takes them
    // from its input queue between steps.
    await sim.faults({ holdStep: true });
    gone.abort();
    await eventually(async () => (await sim.state()).abortsPending === 4 || undefined, 'aborts');
    await sim.faults({ holdStep: false });
    const empty = await eventually(async () => {
      const s = await sim.state();
      return s.running === 0 && s.abortsPending === 0 ? s : undefined;
    }, 'the engine to drop the four');
    expect(empty.usedBlocks).toBe(0);

    // The last step ended with the four in it; none has run since.
    const frozen = await sim.metrics();
    expect(frozen.running).toBe(4);
    expect(frozen.kvUsage).toBeGreaterThan(0);
    expect(frozen.steps).toBeGreaterThan(0);
    // Nothing happens on the engine: a later read is the same, the counter included.
    expect(await sim.metrics()).toEqual(frozen);

    // One request makes it step: the gauges tell the truth again, and the counter moves.
    const res = await fetch(`${sim.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({
        model: 'm',
        messages: [{ role: 'user', content: 'probe' }],
        max_tokens: 3,
      }),
    });
    expect(res.status).toBe(200);
    await res.text();
    const after = await sim.metrics();
    expect(after.running).toBe(0);
    expect(after.kvUsage).toBe(0);
    expect(after.steps).toBe(frozen.steps! + 3);
    // The peak is the four streams: the aborted ones never counted beside the probe.
    expect((await sim.state()).peakRequests).toBe(4);
  });

  it('without it, the gauges are live: the same aborts show at once', async () => {
    const sim = await start(SLOW);
    const gone = new AbortController();
    await sim.streams(4, gone.signal);
    expect((await sim.metrics()).running).toBe(4);
    gone.abort();
    await eventually(async () => (await sim.state()).running === 0 || undefined, 'aborts');
    expect((await sim.metrics()).running).toBe(0);
    expect((await sim.state()).abortsPending).toBe(0);
  });

  it('a request that arrives while the last aborted ones wait for the step is not counted beside them', async () => {
    const sim = await start([...SLOW, '--metrics-per-step']);
    const gone = new AbortController();
    await sim.streams(2, gone.signal);
    await sim.faults({ holdStep: true });
    gone.abort();
    await eventually(async () => (await sim.state()).abortsPending === 2 || undefined, 'aborts');
    const probe = fetch(`${sim.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({
        model: 'm',
        messages: [{ role: 'user', content: 'probe' }],
        max_tokens: 2,
      }),
    });
    await eventually(
      async () => (await sim.state()).waiting === 1 || undefined,
      'the probe queued',
    );
    await sim.faults({ holdStep: false });
    expect((await probe).status).toBe(200);
    expect((await sim.state()).peakRequests).toBe(2);
  });
});

describe('the holdStep fault', () => {
  it('stops the engine mid-step: no token until it is released', async () => {
    const sim = await start(SLOW);
    const ctl = new AbortController();
    const res = await fetch(`${sim.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({
        model: 'm',
        messages: [{ role: 'user', content: 'held' }],
        max_tokens: 100_000,
        ignore_eos: true,
        stream: true,
      }),
      signal: ctl.signal,
    });
    const reader = res.body!.getReader();
    await reader.read();
    await sim.faults({ holdStep: true });
    const before = (await sim.metrics()).steps;
    // Ten steps' worth of the engine's own time passes without a step.
    const heldAt = (await sim.state()).simSeconds;
    await eventually(
      async () => ((await sim.state()).simSeconds > heldAt + 0.1 ? true : undefined),
      'simulated time to pass',
    );
    expect((await sim.metrics()).steps).toBe(before);
    await sim.faults({ holdStep: false });
    await eventually(
      async () => ((await sim.metrics()).steps! > before! ? true : undefined),
      'a step',
    );
    ctl.abort();
  });

  it('is refused with a message when not a boolean', async () => {
    const sim = await start(SLOW);
    const res = await sim.faults({ holdStep: 'yes' });
    expect(res.status).toBe(400);
    expect(((await res.json()) as { error: { message: string } }).error.message).toMatch(
      /holdStep must be a boolean/,
    );
  });
});
