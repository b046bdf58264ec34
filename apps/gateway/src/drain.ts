// Shutting down with clients held (a rolling update). New requests are refused by the
// caller while this runs; held requests keep being served until none is left or the drain
// period ends. What is left then is answered: a queued client gets 503 `shutting_down` (a
// retry lands on another replica) and its job leaves the queue, so no engine ever runs it;
// a running stream gets the error in-band and its engine request is cancelled, freeing the
// slot at once instead of at the end of a generation nobody reads.
import { refusal } from './refuse.js';
import type { HeldRequest } from './held-request.js';
import type { ReplyRouter } from './replies.js';

export interface DrainResult {
  /** Requests answered `shutting_down` at the end of the drain period. */
  cut: number;
}

export async function drain(
  replies: ReplyRouter,
  drainMs: number,
  cutShort: Promise<void>,
): Promise<DrainResult> {
  let timer: NodeJS.Timeout | undefined;
  const deadline = new Promise<void>((resolve) => {
    timer = setTimeout(resolve, drainMs);
  });
  await Promise.race([replies.whenIdle(), deadline, cutShort]);
  clearTimeout(timer);
  const left = [...replies.held.values()];
  const answer = (held: HeldRequest) =>
    held.abandon(
      refusal(
        'shutting_down',
        held.state === 'queued'
          ? 'this gateway replica is shutting down and the request was not served yet; retry'
          : 'this gateway replica is shutting down; the answer is incomplete',
      ),
      'shutting_down',
    );
  // Queued jobs leave the queue before any running request is cut: a cut frees an engine
  // slot, and the dispatcher would hand it to a queued job whose removal had not landed yet.
  const queued = left.filter((held) => held.state === 'queued');
  const running = left.filter((held) => held.state !== 'queued');
  await Promise.all(queued.map(answer).map((takeBack) => takeBack()));
  await Promise.all(running.map(answer).map((takeBack) => takeBack()));
  return { cut: left.length };
}
