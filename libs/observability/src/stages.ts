// Stage marks along one request's way through Sluice, on a diagnostics channel: what the
// benchmark's latency breakdown is made of. Nothing is recorded unless a subscriber listens
// (the bench loads one with `--import`); without one a mark costs a property read.
import { channel } from 'node:diagnostics_channel';

/** The stages, in the order a request passes them. */
export const requestStages = [
  /** Gateway: the completion handler starts (the body is read). */
  'gateway.request',
  /** Gateway: the job goes to Redis (reservation and add in one flight). */
  'gateway.enqueue',
  /** Gateway: Redis has answered the add. */
  'gateway.enqueued',
  /** Dispatcher: BullMQ handed the job over (woken by the add, then moved to active). */
  'dispatcher.job',
  /** Dispatcher: the request is handed to undici for the engine. */
  'dispatcher.engine-call',
  /** Dispatcher: the engine's response head arrived. */
  'dispatcher.engine-head',
  /** Dispatcher: the engine's response body ended. */
  'dispatcher.engine-end',
  /** Gateway: the start frame arrived through pub/sub. */
  'gateway.frame-start',
  /** Gateway: the head frame arrived through pub/sub. */
  'gateway.frame-head',
  /** Gateway: the end frame arrived and the client's response was ended. */
  'gateway.response-end',
] as const;

export type RequestStage = (typeof requestStages)[number];

export interface StageMark {
  stage: RequestStage;
  /** `process.hrtime.bigint()`: a monotonic clock every process on the machine shares. */
  at: bigint;
}

export const STAGE_CHANNEL = 'sluice:request-stage';

const stages = channel(STAGE_CHANNEL);

export function markStage(stage: RequestStage): void {
  if (stages.hasSubscribers) stages.publish({ stage, at: process.hrtime.bigint() } as StageMark);
}
