// The overhead benchmark's latency breakdown (test/bench/stages.ts): grouping marks into
// requests, measuring each stage from its cause, and the critical path's hops.
import { describe, expect, it } from 'vitest';
import { breakdown, criticalPath, spans, type Mark } from '../bench/stages.ts';

const ms = (n: number) => BigInt(Math.round(n * 1e6));

/** One request's marks at `t0` + the given offsets in ms. */
function request(t0: number, offsets: Record<string, number>): Mark[] {
  return Object.entries(offsets).map(([stage, at]) => ({ stage, at: ms(t0 + at) }));
}

const first = {
  'client.send': 0,
  'gateway.request': 0.5,
  'gateway.enqueue': 0.6,
  'dispatcher.job': 1.6,
  'gateway.enqueued': 1.4,
  'dispatcher.engine-call': 1.7,
  'gateway.frame-start': 2.4,
  'dispatcher.engine-head': 2.7,
  'dispatcher.engine-end': 2.8,
  'gateway.frame-head': 3.3,
  'gateway.response-end': 3.4,
  'client.done': 3.9,
};

describe('latency breakdown', () => {
  it('measures every stage from its cause, not from the mark before it in time', () => {
    const { rows, requests } = breakdown(request(100, first));
    expect(requests).toBe(1);
    const row = (stage: string) => rows.find((r) => r.stage === stage)!;
    // The head is measured from the engine call, though the start frame came in between.
    expect(row('dispatcher.engine-head').gap).toBeCloseTo(1.0, 6);
    expect(row('dispatcher.job').gap).toBeCloseTo(1.0, 6);
    expect(row('client.done').fromSend).toBeCloseTo(3.9, 6);
    expect(rows.map((r) => r.stage)).toEqual([
      'gateway.request',
      'gateway.enqueue',
      'gateway.enqueued',
      'dispatcher.job',
      'dispatcher.engine-call',
      'gateway.frame-start',
      'dispatcher.engine-head',
      'dispatcher.engine-end',
      'gateway.frame-head',
      'gateway.response-end',
      'client.done',
    ]);
  });

  it('takes medians over requests, whatever order the processes wrote their marks in', () => {
    const slow = Object.fromEntries(Object.entries(first).map(([s, t]) => [s, t * 3]));
    const marks = [...request(200, slow), ...request(100, first), ...request(300, first)].reverse();
    const { rows, requests } = breakdown(marks);
    expect(requests).toBe(3);
    expect(rows.find((r) => r.stage === 'client.done')!.fromSend).toBeCloseTo(3.9, 6);
  });

  it('leaves out a request that never ended, and a stage a request did not reach', () => {
    const unfinished = request(0, { 'client.send': 0, 'gateway.request': 0.5 });
    const refused = request(50, { 'client.send': 0, 'gateway.request': 9, 'client.done': 10 });
    const { rows, requests } = breakdown([...unfinished, ...refused, ...request(100, first)]);
    expect(requests).toBe(2);
    expect(rows.find((r) => r.stage === 'dispatcher.job')!.fromSend).toBeCloseTo(1.6, 6);
  });

  it('counts ten hops on the critical path and splits its time into hops and work', () => {
    const path = criticalPath(breakdown(request(0, first)).rows);
    expect(path.hops).toBe(10);
    // Hops: 0.5 (HTTP in) + 1.0 (to the dispatcher) + 1.0 (engine) + 0.6 (pub/sub) + 0.5 (out).
    expect(path.hopMs).toBeCloseTo(3.6, 6);
    // Work: 0.1 (gateway) + 0.1 (dispatcher) + 0.1 (frames to the response).
    expect(path.workMs).toBeCloseTo(0.3, 6);
    expect(path.hopMs + path.workMs).toBeCloseTo(first['client.done'], 6);
    expect(Object.keys(spans)).toContain('gateway.frame-start');
  });
});
