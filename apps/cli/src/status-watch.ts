// `sluice status --watch`: the status view, read again every interval. On a terminal each
// frame is drawn over the last one (cursor home, each line cleared to its end, the rest of
// the screen cleared below), so nothing flickers and the scrollback is not filled; piped into
// a file or another program, the frames follow each other, a blank line apart. Ctrl-C (or
// SIGTERM) ends it with exit 0.
import type { PublishedPool } from '@sluice/redis';
import { formatStatus } from './status.js';

export interface StatusFrame {
  /** The Redis line (status.ts, redisLine). */
  head: string;
  pools: ReadonlyArray<PublishedPool>;
}

export interface WatchOptions {
  intervalMs: number;
  out: { isTTY?: boolean; write(text: string): unknown };
  /** One reading; a rejection is shown in the frame and the view goes on. */
  read(): Promise<StatusFrame>;
  now?: () => number;
  /** Ends the view; by default SIGINT and SIGTERM do. */
  stop?: Promise<void>;
}

const ESC = '\u001b[';

/** One frame's text: when it was read, then the one-shot status. */
export function renderFrame(frame: StatusFrame | Error, now: number, intervalMs: number): string {
  const head =
    `sluice status  ${new Date(now).toISOString().slice(11, 23)} UTC` +
    `  every ${intervalMs / 1000} s  (Ctrl-C to quit)\n`;
  if (frame instanceof Error) return `${head}cannot read the status: ${frame.message}\n`;
  return head + frame.head + formatStatus(frame.pools, now);
}

/** What is written for a frame: drawn in place on a terminal, appended elsewhere. */
export function paint(text: string, tty: boolean): string {
  if (!tty) return `${text}\n`;
  const lines = text.endsWith('\n') ? text.slice(0, -1).split('\n') : text.split('\n');
  return `${ESC}H${lines.map((l) => `${l}${ESC}K`).join('\n')}\n${ESC}J`;
}

function signalled(): { stop: Promise<void>; dispose(): void } {
  let resolve!: () => void;
  const stop = new Promise<void>((r) => (resolve = r));
  const on = () => resolve();
  process.once('SIGINT', on);
  process.once('SIGTERM', on);
  return {
    stop,
    dispose() {
      process.off('SIGINT', on);
      process.off('SIGTERM', on);
    },
  };
}

export async function watchStatus(options: WatchOptions): Promise<void> {
  const { intervalMs, out, read } = options;
  const now = options.now ?? Date.now;
  const signals = options.stop ? undefined : signalled();
  const stop = options.stop ?? signals!.stop;
  let stopped = false;
  void stop.then(() => (stopped = true));
  const tty = out.isTTY === true;
  // The cursor hides while frames are drawn over each other, and comes back at the end.
  if (tty) out.write(`${ESC}?25l${ESC}2J`);
  try {
    while (!stopped) {
      const frame = await Promise.race([
        read().catch((err: unknown) => (err instanceof Error ? err : new Error(String(err)))),
        stop.then(() => undefined),
      ]);
      if (frame === undefined) break;
      out.write(paint(renderFrame(frame, now(), intervalMs), tty));
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([
        new Promise((resolve) => (timer = setTimeout(resolve, intervalMs))),
        stop,
      ]);
      clearTimeout(timer);
    }
  } finally {
    signals?.dispose();
    if (tty) out.write(`${ESC}?25h`);
  }
}
