import type { EngineObserver, ObservedEngine } from '../src/index.js';

/**
 * Resolves with the first state, current or from a later 'change' event, that
 * satisfies `predicate`. The deadline only turns a hang into a readable failure.
 */
export function stateWhere(
  observer: EngineObserver,
  predicate: (state: ObservedEngine) => boolean,
  what: string,
  deadlineMs = 30_000,
): Promise<ObservedEngine> {
  if (predicate(observer.state)) return Promise.resolve(observer.state);
  return new Promise((resolve, reject) => {
    const onChange = (state: ObservedEngine) => {
      if (!predicate(state)) return;
      observer.off('change', onChange);
      clearTimeout(timer);
      resolve(state);
    };
    const timer = setTimeout(() => {
      observer.off('change', onChange);
      reject(new Error(`no state with ${what}; last: ${JSON.stringify(observer.state)}`));
    }, deadlineMs);
    observer.on('change', onChange);
  });
}

/** Every state the observer emits from now on, in order. */
export function recordChanges(observer: EngineObserver): ObservedEngine[] {
  const seen: ObservedEngine[] = [];
  observer.on('change', (state) => seen.push(state));
  return seen;
}
