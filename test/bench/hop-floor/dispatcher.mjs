// A floor's dispatcher: takes jobs off the floor's queue, posts each body to the engine, and
// publishes `<id> <answer>` on the floor's reply channel (empty when the call failed). The
// list floor takes one job at a time with a blocking BRPOP, as Sluice's release loop waits on
// BullMQ's marker; the BullMQ floor is a plain BullMQ Worker with the pool's concurrency.
// Usage: node dispatcher.mjs <redis url> <engine url> <list|bullmq>; prints "ready".
import { Buffer } from 'node:buffer';
import { Worker } from 'bullmq';
import { Redis } from 'ioredis';
import { Pool } from 'undici';
import { CONCURRENCY, floorNamed } from './floors.mjs';

const [redisUrl, engineUrl, name] = process.argv.slice(2);
const floor = floorNamed(name);
const command = new Redis(redisUrl);
const engine = new Pool(engineUrl, { connections: CONCURRENCY });
const headers = { 'content-type': 'application/json' };

async function run(id, body) {
  let answer = Buffer.alloc(0);
  try {
    const res = await engine.request({
      path: '/v1/chat/completions',
      method: 'POST',
      headers,
      body,
    });
    const bytes = Buffer.from(await res.body.arrayBuffer());
    if (res.statusCode === 200) answer = bytes;
  } catch {
    // answered empty: the gateway says 502
  }
  await command.publish(floor.replies, Buffer.concat([Buffer.from(`${id} `), answer]));
}

process.on('SIGTERM', () => process.exit(0));
if (name === 'bullmq') {
  const worker = new Worker(floor.queue, (job) => run(job.data.id, job.data.body), {
    connection: new Redis(redisUrl, { maxRetriesPerRequest: null }),
    concurrency: CONCURRENCY,
  });
  await worker.waitUntilReady();
  console.log('ready');
} else {
  const blocking = new Redis(redisUrl);
  await Promise.all([blocking.ping(), command.ping()]);
  console.log('ready');
  for (;;) {
    const [, job] = await blocking.brpopBuffer(floor.jobs, 0);
    const space = job.indexOf(0x20);
    void run(job.toString('latin1', 0, space), job.subarray(space + 1));
  }
}
