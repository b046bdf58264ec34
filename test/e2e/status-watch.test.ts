// `sluice status --watch` as an operator runs it (piped, so frames follow each other): it
// shows a paused pool's queue filling one request at a time with the oldest request's age,
// then draining once the pool resumes, and Ctrl-C ends it with exit 0.
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  answer,
  chat,
  eventually,
  sluiceBin,
  startProcess,
  startStack,
  type Answer,
  type Stack,
  type StartedProcess,
} from '../support/index.ts';

let stack: Stack;

beforeAll(async () => {
  stack = await startStack({ env: { ADMISSION_MAX_INFLIGHT: '2' } });
});

afterAll(async () => {
  await stack?.stop();
});

async function pool(action: string): Promise<string> {
  const { stdout } = await promisify(execFile)(
    process.execPath,
    [sluiceBin, 'pool', action, 'default'],
    { env: { ...process.env, ...stack.env } },
  );
  return stdout;
}

/** The first line matching `pattern` among those the view printed from line `from` on. */
function lineAfter(watch: StartedProcess, from: number, pattern: RegExp, what: string) {
  return eventually(() => {
    const index = watch.output.findIndex((l, i) => i >= from && pattern.test(l));
    return index === -1 ? undefined : { index, line: watch.output[index]! };
  }, what);
}

describe('sluice status --watch', () => {
  it('shows a queue filling with its oldest age, then draining; Ctrl-C exits 0', async () => {
    const watch = await startProcess({
      command: process.execPath,
      args: [sluiceBin, 'status', '--watch', '--interval', '0.2'],
      env: stack.env,
      ready: /^sluice status {2}\d\d:\d\d:\d\d\.\d{3} UTC {2}every 0\.2 s/,
    });
    try {
      const leading = await lineAfter(
        watch,
        0,
        /^ {2}engine \S+ {2}in-flight 0\/2 {2}gate open {2}state healthy {2}running/,
        'a healthy engine with its gauges',
      );
      expect(await pool('pause')).toMatch(/^pool default paused/);
      let seen = await lineAfter(watch, leading.index, /^pool default {2}mode paused /, 'paused');
      const waiting: Array<Promise<Answer>> = [];
      for (const n of [1, 2, 3]) {
        waiting.push(answer(chat(stack.gateway.url, `queued ${n}`, { max_tokens: 2 })));
        seen = await lineAfter(
          watch,
          seen.index,
          new RegExp(`^pool default {2}mode paused .*queue: wait 0 prioritized ${n} active 0`),
          `${n} queued in the view`,
        );
      }
      // The oldest request's age shows, and grows while it waits.
      const aged = await lineAfter(
        watch,
        seen.index,
        /prioritized 3 active 0 held 0 {2}oldest (?!0\.0 )\d+\.\d s$/,
        'the oldest age above zero',
      );
      expect(Number(/oldest (\d+\.\d) s$/.exec(aged.line)![1])).toBeGreaterThan(0);

      expect(await pool('resume')).toMatch(/^pool default open/);
      expect((await Promise.all(waiting)).map((a) => a.status)).toEqual([200, 200, 200]);
      const drained = await lineAfter(
        watch,
        aged.index,
        /^pool default {2}mode open .*queue: wait 0 prioritized 0 active 0 held 0 {2}oldest 0\.0 s$/,
        'the drained queue in the view',
      );
      expect(drained.index).toBeGreaterThan(aged.index);
    } finally {
      await watch.stop('SIGINT');
    }
    expect(watch.child.exitCode).toBe(0);
    expect(watch.output.filter((l) => /cannot read|Error/.test(l))).toEqual([]);
  });
});
