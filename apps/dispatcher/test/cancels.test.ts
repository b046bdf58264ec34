// Cancelling running jobs, and jobs whose cancel came before their release: a job's
// cancellation aborts once, with the first reason, and tells its one listener once.
import { describe, expect, it } from 'vitest';
import { CancelBook, Cancellation, CancelledError, earlyCancelMs } from '../src/cancels.ts';

describe('Cancellation', () => {
  it('aborts once, keeps the first reason and tells its listener once', () => {
    const cancellation = new Cancellation();
    const heard: string[] = [];
    cancellation.onAbort((why) => heard.push(why.message));
    expect(cancellation.aborted).toBe(false);
    expect(cancellation.reason).toBeUndefined();
    cancellation.abort(new CancelledError('client went away'));
    cancellation.abort(new CancelledError('its lock was lost', 'dispatcher_lost'));
    expect(cancellation.aborted).toBe(true);
    expect(cancellation.reason?.message).toBe('client went away');
    expect(heard).toEqual(['client went away']);
  });

  it('tells nobody once the listener is removed, and only the latest listener', () => {
    const removed = new Cancellation();
    const heard: string[] = [];
    removed.onAbort(() => heard.push('removed'))();
    removed.abort(new CancelledError('gone'));
    const replaced = new Cancellation();
    const stopFirst = replaced.onAbort(() => heard.push('first'));
    replaced.onAbort(() => heard.push('second'));
    stopFirst(); // removing a replaced listener leaves the one after it
    replaced.abort(new CancelledError('gone'));
    expect(heard).toEqual(['second']);
  });
});

describe('CancelBook', () => {
  it('aborts a running job with the reason and the code its client hears', () => {
    const book = new CancelBook(60_000, () => 0);
    const cancellation = book.register('j1');
    expect(book.cancel('j1', 'its lock was lost', 'dispatcher_lost')).toBe(true);
    expect(cancellation.reason).toMatchObject({
      message: 'its lock was lost',
      frameCode: 'dispatcher_lost',
    });
  });

  it('remembers a cancel that came before the release, until it is pruned', () => {
    let now = 0;
    const book = new CancelBook(1000, () => now);
    expect(book.cancel('early', 'client went away')).toBe(false);
    expect(book.register('early').reason?.message).toBe('client went away');
    book.cancel('late', 'client went away');
    now = 1000;
    book.prune();
    expect(book.register('late').aborted).toBe(false);
  });

  it('treats a cancel after the run ended as one that came early', () => {
    const book = new CancelBook(60_000, () => 0);
    const cancellation = book.register('j2');
    book.unregister('j2');
    expect(book.cancel('j2', 'too late')).toBe(false);
    expect(cancellation.aborted).toBe(false);
  });

  it('keeps a cancel for a held job until the last moment it can be released, whatever the park limit', () => {
    for (const maxParkSeconds of [120, 600]) {
      let now = 0;
      // As the dispatcher builds it: from its pools' park limits (one pool shorter here).
      const book = new CancelBook(
        earlyCancelMs([{ maxParkSeconds: 30 }, { maxParkSeconds }]),
        () => now,
      );
      // The client left while its long prompt was being held back: the cancel finds no run.
      expect(book.cancel('held', 'client went away')).toBe(false);
      // Promoted and released at its deadline, the park limit after the cancel at the latest.
      now = maxParkSeconds * 1000;
      book.prune();
      expect(book.register('held').reason?.message).toBe('client went away');
    }
  });
});
