// The reply router's silence watchdog (replies.ts), on fake timers against a fake subscriber:
// a dispatcher that stops sending frames fails its requests, and a stall of the gateway's own
// event loop does not pass for one. (Frames through a real redis-server: held-replies.test.ts.)
import { EventEmitter } from 'node:events';
import type { Redis } from '@sluice/redis';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import type { HeldRequest } from '../src/held-request.ts';
import { ReplyRouter } from '../src/replies.ts';

const SILENCE_MS = 5000;
/** The watchdog's interval for that timeout (a fifth of it). */
const TICK_MS = 1000;
/** The router's clock: fake time, plus what a stalled event loop lost (timers run late by it). */
let stalledMs = 0;
const clock = () => Date.now() + stalledMs;

interface FakeHeld {
  state: 'queued' | 'running';
  lastFrameAt: number;
  silent: () => void;
  silenced: number;
}

function fakeHeld(state: FakeHeld['state']): FakeHeld {
  const held: FakeHeld = {
    state,
    lastFrameAt: clock(),
    silenced: 0,
    silent: () => (held.silenced += 1),
  };
  return held;
}

describe('ReplyRouter silence watchdog', () => {
  let router: ReplyRouter;
  let held: FakeHeld;

  beforeEach(() => {
    vi.useFakeTimers();
    stalledMs = 0;
    const subscriber = Object.assign(new EventEmitter(), { status: 'ready' });
    router = new ReplyRouter(
      subscriber as unknown as Redis,
      'replies',
      SILENCE_MS,
      clock,
      () => {},
      () => {},
    );
    held = fakeHeld('running');
    router.held.set('job-1', held as unknown as HeldRequest);
  });

  afterEach(() => {
    router.stop();
    vi.useRealTimers();
  });

  /** The dispatcher's liveness frames, one a second, for `ms`. */
  function framesFor(ms: number): void {
    for (let t = 0; t < ms; t += 1000) {
      vi.advanceTimersByTime(1000);
      held.lastFrameAt = clock();
    }
  }

  it('fails a running request whose dispatcher has been silent for the timeout', () => {
    framesFor(3000);
    vi.advanceTimersByTime(SILENCE_MS - TICK_MS);
    expect(held.silenced).toBe(0);
    vi.advanceTimersByTime(2 * TICK_MS);
    expect(held.silenced).toBe(1);
  });

  it('leaves a queued request to its park limit', () => {
    held.state = 'queued';
    vi.advanceTimersByTime(4 * SILENCE_MS);
    expect(held.silenced).toBe(0);
  });

  it("fails nobody when the gateway's own event loop stalled past the timeout", () => {
    framesFor(3000);
    // The loop is blocked for 8 s: the frames of those seconds wait in the socket, and the
    // next tick runs 8 s late, before the loop reads them.
    stalledMs = 8000;
    vi.advanceTimersByTime(TICK_MS);
    expect(held.silenced).toBe(0);
    // The loop reads them before the tick after.
    held.lastFrameAt = clock();
    vi.advanceTimersByTime(TICK_MS);
    expect(held.silenced).toBe(0);
    // A dispatcher that stays silent after the stall is still noticed.
    vi.advanceTimersByTime(SILENCE_MS + TICK_MS);
    expect(held.silenced).toBeGreaterThan(0);
  });

  it('still notices a dead dispatcher when every tick runs late', () => {
    framesFor(2000);
    for (let tick = 0; tick < 4 && held.silenced === 0; tick += 1) {
      stalledMs += 3 * TICK_MS;
      vi.advanceTimersByTime(TICK_MS);
    }
    expect(held.silenced).toBeGreaterThan(0);
  });
});
