// BullMQ's own share of the Redis commands per request, measured apart from Sluice: on a fresh
// redis-server, a queue set up as Sluice sets up a pool's (global concurrency, the events
// stream at QUEUE_EVENTS_MAX_LEN, prioritised jobs removed on completion) gets `jobs` adds,
// then one worker takes the first and completes each with `fetchNext`, the cheapest way
// BullMQ has to run a queue of jobs one after the other (Sluice's slot handover). Counted
// from INFO commandstats, which includes the commands BullMQ's Lua scripts run. `quiet` runs
// the scripts as Sluice runs them, without the events stream and the add's id counter
// (libs/redis bull-scripts.ts).
import { QUEUE_EVENTS_MAX_LEN } from '@sluice/protocol';
import { bullScript, quietWorkerScripts, withoutEventsStream } from '@sluice/redis';
import { Job, Queue, Worker } from 'bullmq';
import { Redis } from 'ioredis';
import { startRedis } from '../support/index.ts';

async function commandCalls(client: Redis): Promise<number> {
  const info = await client.info('commandstats');
  let calls = 0;
  for (const m of info.matchAll(/^cmdstat_([^:]+):calls=(\d+)/gm))
    if (m[1] !== 'info') calls += Number(m[2]);
  return calls;
}

/** Commands per job for BullMQ alone: `add` (the add) and `run` (take and complete). */
export async function bullmqFloor(
  jobs = 1000,
  quiet = false,
): Promise<{ add: number; run: number }> {
  const server = await startRedis();
  const connection = new Redis(server.url, { maxRetriesPerRequest: null });
  const name = '{pool-floor}';
  const queue = new Queue(name, {
    connection,
    streams: { events: { maxLen: QUEUE_EVENTS_MAX_LEN } },
  });
  const workerConnection = connection.duplicate();
  const worker = new Worker(name, null, { connection: workerConnection, autorun: false });
  try {
    await queue.setGlobalConcurrency(4);
    if (quiet) {
      await Promise.all([queue.waitUntilReady(), worker.waitUntilReady()]);
      quietWorkerScripts(workerConnection);
      // Sluice's admission runs the add quieted inside its own script; here it is redefined.
      const add = bullScript(connection, 'addPrioritizedJob');
      connection.defineCommand(add.name, {
        numberOfKeys: add.numberOfKeys,
        lua: withoutEventsStream(add.lua, { ownJobId: true }),
      });
    }
    const opts = { priority: 5, attempts: 1, removeOnComplete: true, removeOnFail: true };
    const runAll = async () => {
      let job: Job | undefined = await worker.getNextJob('token', { block: false });
      while (job) {
        const next = (await job.moveToCompleted('ok', 'token', true)) as unknown;
        job = undefined;
        if (Array.isArray(next) && next[0]) {
          job = Job.fromJSON(worker, next[0], next[1] as string);
          job.token = 'token';
        }
      }
    };
    // Warm: scripts loaded, keys made.
    for (let i = 0; i < 10; i += 1) await queue.add('completion', {}, { ...opts, jobId: `w${i}` });
    await runAll();
    const start = await commandCalls(connection);
    for (let i = 0; i < jobs; i += 1)
      await queue.add('completion', {}, { ...opts, jobId: `j${i}` });
    const added = await commandCalls(connection);
    await runAll();
    const ran = await commandCalls(connection);
    return { add: (added - start) / jobs, run: (ran - added) / jobs };
  } finally {
    await worker.close();
    await queue.close();
    // BullMQ leaves connections it was given open.
    connection.disconnect();
    workerConnection.disconnect();
    await server.stop();
  }
}
