// Where every process's log lines go: standard output, one write per turn of the event loop.
//
// pino's default destination writes each line with its own write(2) as it is made; the
// gateway makes one access-log line per request, so at a few thousand requests a second the
// system calls and the wake-ups of whoever reads the pipe are a measurable share of its CPU
// (docs/performance.md, "The access log"). Here the lines of one turn are buffered in pino's
// own destination (sonic-boom, synchronous, so EAGAIN on a full pipe is retried as pino does)
// and written together once the turn's I/O callbacks have run (`setImmediate`), as the Redis
// connections cork their writes. A line is never held past the turn it was made in, and the
// process's `exit` writes what is left, so only a SIGKILL in the middle of a turn loses the
// lines of that turn.
import { destination } from 'pino';

/** Lines past this size in one turn go out at once, without waiting for the turn's end. */
const TURN_BUFFER_BYTES = 8192;

export interface LogStream {
  write(line: string): void;
}

let stdout: LogStream | undefined;

/** The process's standard-output log stream (one per process). */
export function stdoutPerTurn(): LogStream {
  stdout ??= logStreamPerTurn(1);
  return stdout;
}

/** A log stream onto the open file descriptor `fd`, written once per turn. */
export function logStreamPerTurn(fd: number): LogStream {
  const dest = destination({ dest: fd, sync: true, minLength: TURN_BUFFER_BYTES });
  let scheduled = false;
  const flush = () => {
    scheduled = false;
    dest.flush();
  };
  process.on('exit', () => {
    if (scheduled) dest.flushSync();
  });
  return {
    write(line) {
      dest.write(line);
      if (scheduled) return;
      scheduled = true;
      setImmediate(flush);
    },
  };
}
