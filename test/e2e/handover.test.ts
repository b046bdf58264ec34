// The slot handover under a backlog: 64 connections, each sending its requests one after the
// other, in front of cap 4. Most slots go from one job to the next inside BullMQ's completion
// script (moveToFinished with fetchNext); the engine must still never hold more than 4, every
// request must be answered once, and none may run twice. With tenants, the fair share picks
// each job handed over, in turn with the release loop's takes.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  answer,
  chat,
  metricSum,
  tenantPoolYaml,
  startStack,
  untilReady,
  type SluiceProcess,
  type Stack,
  type TestEngineSim,
} from '../support/index.ts';

const CONNECTIONS = 64;
const PER_CONNECTION = 8;
// Each answer takes a few engine steps: the four slots stay full while the queue backs up.
const SIM_ARGS = ['--max-num-seqs', '64', '--step-overhead-seconds', '0.002'];
const KEYS = {
  alpha: 'sk-alpha-handover-test-012345678',
  beta: 'sk-beta-handover-test-0123456789',
};

interface Deployment {
  sim: TestEngineSim;
  gateways: SluiceProcess[];
  dispatchers: SluiceProcess[];
}

/** 64 connections of 8 requests each (mixed streaming); with `keys`, connections alternate them. */
async function hammer({ sim, gateways, dispatchers }: Deployment, keys?: string[]) {
  await fetch(`${sim.url}/sim/peak/reset`, { method: 'POST' });
  const receivedBefore = (await sim.state()).receivedTotal as number;
  const marks = new Set<string>();
  const connection = async (c: number) => {
    const answers = [];
    for (let i = 0; i < PER_CONNECTION; i += 1) {
      const mark = `c${c}-r${i}`;
      const stream = (c + i) % 2 === 0;
      const body = JSON.stringify({
        model: 'm',
        messages: [{ role: 'user', content: mark }],
        max_tokens: 4,
        stream,
      });
      const a = await answer(
        keys
          ? fetch(`${gateways[c % 2]!.url}/v1/chat/completions`, {
              method: 'POST',
              headers: {
                'content-type': 'application/json',
                authorization: `Bearer ${keys[c % keys.length]}`,
              },
              body,
            })
          : chat(gateways[c % 2]!.url, mark, { max_tokens: 4, stream }),
      );
      answers.push({ mark, stream, ...a });
    }
    return answers;
  };
  const answers = (
    await Promise.all(Array.from({ length: CONNECTIONS }, (_, c) => connection(c)))
  ).flat();

  for (const a of answers) {
    expect(a.status, `${a.mark}: ${a.body.slice(0, 200)}`).toBe(200);
    if (a.stream) expect(a.body.endsWith('data: [DONE]\n\n'), a.mark).toBe(true);
    else expect(JSON.parse(a.body).choices[0].finish_reason, a.mark).toBe('length');
    marks.add(a.mark);
  }
  expect(marks.size).toBe(CONNECTIONS * PER_CONNECTION);
  const state = await sim.state();
  // Nothing ran twice: the engine received exactly one request per answer.
  expect((state.receivedTotal as number) - receivedBefore).toBe(CONNECTIONS * PER_CONNECTION);
  expect(state.peakRequests).toBe(4);
  const [leader, standby] = dispatchers;
  expect(await metricSum(leader!.url, 'sluice_released_total')).toBe(CONNECTIONS * PER_CONNECTION);
  // The handover really ran: without it, every job would have been a take of the loop.
  expect(await metricSum(leader!.url, 'sluice_handovers_total')).toBeGreaterThan(0);
  // The standby took nothing.
  expect((await metricSum(standby!.url, 'sluice_released_total')) ?? 0).toBe(0);
}

describe('slot handover', () => {
  let stack: Stack;
  beforeAll(async () => {
    stack = await startStack({
      sim: SIM_ARGS,
      env: { ADMISSION_MAX_INFLIGHT: '4', VLLM_MAX_QUEUE_DEPTH: '1000' },
      dispatchers: 2,
      gateways: 2,
    });
  });
  afterAll(() => stack?.stop());

  it('64 connections at cap 4: the engine peaks at exactly 4, every request runs once, slots are handed over', async () => {
    await hammer(stack);
  });
});

describe('slot handover with tenants', () => {
  let deployment: Stack;
  beforeAll(async () => {
    deployment = await startStack({
      sim: SIM_ARGS,
      config: ({ url }) =>
        tenantPoolYaml({ tenants: KEYS, engineUrl: url, maxInflight: 4, queueDepth: 1000 }),
      // The first dispatcher leads pool main before the second starts; the second stands by.
      dispatcherIds: ['leader', 'standby'],
      leasePool: 'main',
      gateways: 2,
    });
    await untilReady(deployment.gateway);
  }, 60_000);
  afterAll(() => deployment?.stop());

  it('two tenants, 64 connections at cap 4: peak exactly 4, every request once, the share picks each handover', async () => {
    await hammer(deployment, [KEYS.alpha, KEYS.beta]);
    const leader = deployment.dispatchers[0]!;
    // Each tenant's half was released; the fair share picked before every take and handover.
    expect(await metricSum(leader.url, 'sluice_tenant_released_total')).toBe(
      CONNECTIONS * PER_CONNECTION,
    );
    expect(await metricSum(leader.url, 'sluice_fair_share_picks_total')).toBeGreaterThanOrEqual(
      (await metricSum(leader.url, 'sluice_handovers_total'))!,
    );
    // Picks used the reading sent ahead of the take before them, in the same script as its move.
    expect(
      await metricSum(leader.url, 'sluice_fair_share_readings_total', { source: 'ahead' }),
    ).toBeGreaterThan(0);
  });
});
