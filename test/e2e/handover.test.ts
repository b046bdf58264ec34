// The slot handover under a backlog: 64 connections, each sending its requests one after the
// other, in front of cap 4. Most slots go from one job to the next inside BullMQ's completion
// script (moveToFinished with fetchNext); the engine must still never hold more than 4, every
// request must be answered once, and none may run twice.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { answer, chat, metricSum, startStack, type Stack } from '../support/index.ts';

const CONNECTIONS = 64;
const PER_CONNECTION = 8;

let stack: Stack;

beforeAll(async () => {
  // Each answer takes a few engine steps: the four slots stay full while the queue backs up.
  stack = await startStack({
    sim: ['--max-num-seqs', '64', '--step-overhead-seconds', '0.002'],
    env: { ADMISSION_MAX_INFLIGHT: '4', VLLM_MAX_QUEUE_DEPTH: '1000' },
    dispatchers: 2,
    gateways: 2,
  });
});

afterAll(() => stack?.stop());

describe('slot handover', () => {
  it('64 connections at cap 4: the engine peaks at exactly 4, every request runs once, slots are handed over', async () => {
    const { sim, gateways, dispatcher } = stack;
    await fetch(`${sim.url}/sim/peak/reset`, { method: 'POST' });
    const receivedBefore = (await sim.state()).receivedTotal as number;
    const marks = new Set<string>();
    const connection = async (c: number) => {
      const answers = [];
      for (let i = 0; i < PER_CONNECTION; i += 1) {
        const mark = `c${c}-r${i}`;
        const stream = (c + i) % 2 === 0;
        const a = await answer(chat(gateways[c % 2]!.url, mark, { max_tokens: 4, stream }));
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
    expect(await metricSum(dispatcher.url, 'sluice_released_total')).toBe(
      CONNECTIONS * PER_CONNECTION,
    );
    // The handover really ran: without it, every job would have been a take of the loop.
    expect(await metricSum(dispatcher.url, 'sluice_handovers_total')).toBeGreaterThan(0);
    // The standby took nothing.
    expect((await metricSum(stack.dispatchers[1]!.url, 'sluice_released_total')) ?? 0).toBe(0);
  });
});
