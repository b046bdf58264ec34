// What a test starts is stopped after it, last started first (a client of the ones started
// before it, such as a gateway of its Redis, goes before them).
import { afterEach } from 'vitest';

export interface Stoppable {
  stop(): Promise<void>;
}

/** A list to push what each test starts onto; registers the stop after each test. */
export function stoppedAfterEach(): Stoppable[] {
  const started: Stoppable[] = [];
  afterEach(async () => {
    for (const p of started.splice(0).reverse()) await p.stop();
  });
  return started;
}
