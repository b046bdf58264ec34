// Frozen engine gauges (docs/broker.md, "Frozen gauges"). vLLM v1 refreshes its gauges only
// from the stats of an engine step, and runs no step while it holds no request
// (vllm/v1/engine/core.py, vllm/v1/metrics/loggers.py): after every request is aborted at once
// they keep showing the requests that are gone (vllm-project/vllm#22545, #29928). Sluice causes
// such aborts itself when its clients leave. The engine simulator publishes its gauges the same
// way here (--metrics-per-step). Without the probe the gate read the frozen gauges as an engine
// full of traffic that bypassed Sluice, released nothing, so the engine never stepped and the
// gauges never refreshed: every later request ended 503 park_timeout.
import { parseExposition, readVllmState } from '@sluice/engine-metrics';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  answer,
  chat,
  eventually,
  metricSum,
  startStack,
  streamStarted,
  untilReady,
  type Stack,
} from '../support/index.ts';

const CAP = 4;

let stack: Stack;

beforeAll(async () => {
  stack = await startStack({
    // Slow decode keeps the streams alive until their clients leave.
    sim: ['--max-num-seqs', '64', '--decode-seconds-per-sequence', '0.01', '--metrics-per-step'],
    env: {
      ADMISSION_MAX_INFLIGHT: String(CAP),
      ENGINE_SCRAPE_INTERVAL_MS: '100',
      // Gauges count as stale after 2.1 s without a scrape, not 400 ms: a loaded machine
      // delays scrapes, and stale gauges would skip the gauge conditions (fail mode open).
      ENGINE_STALE_AFTER_FAILURES: '20',
      ADMISSION_FROZEN_GAUGES_SECONDS: '1',
      // A ceiling for the request that finds the engine frozen, not a speed: before the probe
      // it waited this long and ended 503 park_timeout.
      ADMISSION_MAX_PARK_SECONDS: '60',
    },
  });
  await untilReady(stack.gateway);
});

afterAll(async () => {
  await stack?.stop();
});

const frozenMetric = () =>
  metricSum(stack.dispatcher.url, 'sluice_engine_gauges_frozen', { pool: 'default' });

describe('frozen engine gauges', () => {
  it('serves a request after four streams whose clients left together, and the engine never holds more than the cap', async () => {
    const { sim, gateway, dispatcher } = stack;
    const gone = new AbortController();
    const streams = await Promise.all(
      Array.from({ length: CAP }, (_, i) =>
        chat(
          gateway.url,
          `stream ${i}`,
          { stream: true, max_tokens: 100_000, ignore_eos: true },
          gone.signal,
        ),
      ),
    );
    for (const res of streams) expect(res.status).toBe(200);
    const started = await Promise.all(streams.map((res) => streamStarted(res)));
    // Their clients leave below: the rest of each stream is cut short, on purpose.
    for (const s of started) s.rest.catch(() => {});
    // A started stream may have had only the gateway's keep-alive so far: wait for the engine
    // to run all four.
    await eventually(
      async () => ((await sim.state()).running === CAP ? true : undefined),
      'the engine to run the four streams',
    );

    // The four clients leave together. The step in flight is held until the engine has all
    // four aborts, so they land between two steps, as vLLM takes them from its input queue:
    // the last step's stats, the gauges from now on, still count the four.
    await sim.setFaults({ holdStep: true });
    gone.abort();
    await eventually(async () => {
      const s = await sim.state();
      return (s['abortsPending'] as number) + (CAP - s.running) === CAP ? true : undefined;
    }, 'the engine to be told of the four aborts');
    await eventually(
      async () => ((await metricSum(dispatcher.url, 'sluice_inflight')) === 0 ? true : undefined),
      'the dispatcher to count the four cancelled',
    );
    await sim.setFaults({ holdStep: false });
    await eventually(async () => {
      const s = await sim.state();
      return s.running === 0 && s['abortsPending'] === 0 ? true : undefined;
    }, 'the engine to drop the four');

    // The scene: nothing runs on the engine, nothing of Sluice's is in flight, and the gauges
    // still say four requests (no step ran since, so none refreshed them).
    const shown = readVllmState(parseExposition(await sim.metricsText()));
    expect(shown.running).toBe(CAP);
    expect((await sim.state()).running).toBe(0);

    // A new request: served, by the probe that makes the engine step.
    const served = await answer(chat(gateway.url, 'after the four', { max_tokens: 4 }));
    expect(served.reason).toBeNull();
    expect(served.status).toBe(200);

    // The gauges moved again once the engine stepped. (Whether the dispatcher's warning came
    // before the probe depends on where its scrape fell: the unit tests pin the warning.)
    await eventually(
      async () => (((await frozenMetric()) ?? 0) === 0 ? true : undefined),
      'sluice_engine_gauges_frozen back to 0',
    );
    const after = readVllmState(parseExposition(await sim.metricsText()));
    expect(after.running).toBe(0);
    // The probe ran alone: the engine never held more than the four streams.
    expect((await sim.state()).peakRequests).toBeLessThanOrEqual(CAP);
  }, 180_000);
});
