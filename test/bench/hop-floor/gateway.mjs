// A floor's gateway: Sluice's path with none of Sluice's work. It takes an HTTP request, puts
// `<id> <body>` on the floor's queue (an LPUSH, or BullMQ's add), and answers with what the
// floor's dispatcher publishes for that id on the floor's reply channel. No admission, frames,
// metrics or logs: what the same hops cost on this machine (hop-floor.bench.test.ts).
// Usage: node gateway.mjs <redis url> <list|bullmq>; prints {"url": ...} once it listens.
import { Buffer } from 'node:buffer';
import { createServer } from 'node:http';
import { QUEUE_EVENTS_MAX_LEN } from '@sluice/protocol';
import { Queue } from 'bullmq';
import { Redis } from 'ioredis';
import { BULLMQ_JOB_OPTIONS, CONCURRENCY, floorNamed } from './floors.mjs';

const [redisUrl, name] = process.argv.slice(2);
const floor = floorNamed(name);
const command = new Redis(redisUrl, { maxRetriesPerRequest: null });
const subscriber = new Redis(redisUrl);

/** Puts one job on the floor's queue. */
let enqueue;
if (name === 'list') {
  enqueue = (id, body) => command.lpush(floor.jobs, Buffer.concat([Buffer.from(`${id} `), body]));
} else {
  const queue = new Queue(floor.queue, {
    connection: command,
    streams: { events: { maxLen: QUEUE_EVENTS_MAX_LEN } },
  });
  await queue.waitUntilReady();
  await queue.setGlobalConcurrency(CONCURRENCY);
  enqueue = (id, body) =>
    queue.add(
      'completion',
      { id, body: body.toString('utf8') },
      { ...BULLMQ_JOB_OPTIONS, jobId: `floor-${id}` },
    );
}

const waiting = new Map();
let lastId = 0;
subscriber.on('messageBuffer', (_channel, message) => {
  const space = message.indexOf(0x20);
  const id = message.toString('latin1', 0, space);
  const res = waiting.get(id);
  if (!res) return;
  waiting.delete(id);
  const body = message.subarray(space + 1);
  // An empty answer: the engine call failed.
  res.writeHead(body.length > 0 ? 200 : 502, { 'content-type': 'application/json' });
  res.end(body);
});
await subscriber.subscribe(floor.replies);

const server = createServer((req, res) => {
  const chunks = [];
  req.on('data', (chunk) => chunks.push(chunk));
  req.on('end', () => {
    const id = String((lastId += 1));
    waiting.set(id, res);
    enqueue(id, Buffer.concat(chunks)).catch(() => {
      waiting.delete(id);
      res.writeHead(503).end();
    });
  });
});
server.listen(0, '127.0.0.1', () => {
  console.log(JSON.stringify({ url: `http://127.0.0.1:${server.address().port}` }));
});
process.on('SIGTERM', () => process.exit(0));
