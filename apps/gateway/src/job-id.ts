// Job ids that sort by the time they were made: a tenant's queued jobs sit in a sorted set
// scored by BullMQ priority, and Redis orders equal scores by member, so ids that sort like
// their enqueue times keep each tenant's queue first come, first served (keys.tenantQueued).
// The layout is UUIDv7's (RFC 9562 §5.7): 48 bits of Unix ms, then a counter that keeps ids
// of one millisecond in order within this process, then random bits.
import { randomBytes } from 'node:crypto';

let lastMs = 0;
let counter = 0;

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
  const random = randomBytes(8);
  const hex = lastMs.toString(16).padStart(12, '0');
  const rand = random.toString('hex');
  const variant = ((random[0]! & 0x3f) | 0x80).toString(16);
  return (
    `${hex.slice(0, 8)}-${hex.slice(8, 12)}-7${counter.toString(16).padStart(3, '0')}-` +
    `${variant}${rand.slice(2, 4)}-${rand.slice(4, 16)}`
  );
}
