// Job ids that sort by the time they were made: a tenant's queued jobs sit in a sorted set
// scored by BullMQ priority, and Redis orders equal scores by member, so ids that sort like
// their enqueue times keep each tenant's queue first come, first served (keys.tenantQueued).
// The layout is UUIDv7's (RFC 9562 §5.7): 48 bits of Unix ms, then a counter that keeps ids
// of one millisecond in order within this process, then random bits.
import { randomFillSync } from 'node:crypto';

let lastMs = 0;
let counter = 0;

// Random bytes drawn 4 KiB at a time, as Node's own randomUUID caches them: one draw per id
// was a sixth of the gateway's CPU under load.
const RANDOM_POOL_BYTES = 4096;
const randomPool = Buffer.alloc(RANDOM_POOL_BYTES);
let randomAt = RANDOM_POOL_BYTES;

function random8(): Buffer {
  if (randomAt + 8 > RANDOM_POOL_BYTES) {
    randomFillSync(randomPool);
    randomAt = 0;
  }
  randomAt += 8;
  return randomPool.subarray(randomAt - 8, randomAt);
}

/** A new UUIDv7-shaped job id; within one process strictly increasing. */
export function newJobId(now: number): string {
  if (now > lastMs) {
    lastMs = now;
    counter = 0;
  } else {
    // The clock stood still or stepped back: keep counting on the last millisecond.
    counter += 1;
    if (counter > 0xfff) {
      lastMs += 1;
      counter = 0;
    }
  }
  const random = random8();
  const hex = lastMs.toString(16).padStart(12, '0');
  const rand = random.toString('hex');
  const variant = ((random[0]! & 0x3f) | 0x80).toString(16);
  return (
    `${hex.slice(0, 8)}-${hex.slice(8, 12)}-7${counter.toString(16).padStart(3, '0')}-` +
    `${variant}${rand.slice(2, 4)}-${rand.slice(4, 16)}`
  );
}
