// Stage marks: published on the diagnostics channel to whoever listens, in the order made.
import { subscribe, unsubscribe } from 'node:diagnostics_channel';
import { expect, it } from 'vitest';
import { markStage, STAGE_CHANNEL, type StageMark } from '../src/stages.ts';

it('publishes each mark with its stage and a monotonic time to a subscriber', () => {
  const marks: StageMark[] = [];
  const listener = (mark: unknown) => marks.push(mark as StageMark);
  markStage('gateway.request');
  subscribe(STAGE_CHANNEL, listener);
  const before = process.hrtime.bigint();
  markStage('gateway.enqueue');
  markStage('gateway.enqueued');
  unsubscribe(STAGE_CHANNEL, listener);
  markStage('gateway.response-end');
  expect(marks.map((m) => m.stage)).toEqual(['gateway.enqueue', 'gateway.enqueued']);
  expect(marks[0]!.at).toBeGreaterThanOrEqual(before);
  expect(marks[1]!.at).toBeGreaterThanOrEqual(marks[0]!.at);
});
