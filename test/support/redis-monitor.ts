// A Redis MONITOR connection for tests that check the order in which Redis ran commands.
//
// ioredis's own `monitor()` rejects, on a busy Redis, with "Command queue state error": it
// marks the connection monitoring one microtask after MONITOR's OK (event_handler.js), so a
// monitored command that arrives in the same read as that OK is taken for a reply to a command
// it never sent (DataHandler.js `shiftCommand`), and the error rejects the promise. Such a
// line is of a command Redis ran before the caller could listen: it is dropped, and any other
// error is thrown as ioredis would with no listener.
import { Redis } from 'ioredis';

const QUEUE_STATE_ERROR = 'Command queue state error';

/** A connection in MONITOR mode: its `monitor` events list the commands Redis runs from now. */
export async function monitorRedis(url: string): Promise<Redis> {
  const monitor = new Redis(url, { monitor: true, lazyConnect: true });
  let monitoring = false;
  monitor.on('error', (err: Error) => {
    if (monitoring || !err.message.startsWith(QUEUE_STATE_ERROR)) throw err;
  });
  const started = new Promise<void>((resolve) =>
    monitor.once('monitoring', () => {
      monitoring = true;
      resolve();
    }),
  );
  await monitor.connect();
  await started;
  return monitor;
}
