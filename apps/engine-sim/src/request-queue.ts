// The waiting queue, after vllm/v1/core/sched/request_queue.py: FCFS is a deque
// (`FCFSRequestQueue(deque[Request])`, `prepend_request` = appendleft), priority is a heap
// ordered by (priority, arrival_time) (`PriorityRequestQueue`, `heapq.heappush(self._heap,
// (request.priority, request.arrival_time, request))`), where "prepend" is a plain push:
// a preempted request goes back in its (priority, arrival) place.
import type { Sequence } from './sequence.js';

export type SchedulingPolicy = 'fcfs' | 'priority';

export interface RequestQueue extends Iterable<Sequence> {
  readonly length: number;
  peek(): Sequence | undefined;
  pop(): Sequence | undefined;
  add(seq: Sequence): void;
  /** A preempted request going back to the queue. */
  prepend(seq: Sequence): void;
  remove(seq: Sequence): boolean;
}

class FcfsQueue implements RequestQueue {
  protected readonly items: Sequence[] = [];
  get length() {
    return this.items.length;
  }
  peek() {
    return this.items[0];
  }
  pop() {
    return this.items.shift();
  }
  add(seq: Sequence) {
    this.items.push(seq);
  }
  prepend(seq: Sequence) {
    this.items.unshift(seq);
  }
  remove(seq: Sequence) {
    const i = this.items.indexOf(seq);
    if (i === -1) return false;
    this.items.splice(i, 1);
    return true;
  }
  [Symbol.iterator]() {
    return this.items[Symbol.iterator]();
  }
}

/** Sorted by (priority, arrival); ties keep insertion order. Queues here are short. */
class PriorityQueue extends FcfsQueue {
  override add(seq: Sequence) {
    let i = this.items.length;
    while (i > 0 && before(seq, this.items[i - 1]!)) i -= 1;
    this.items.splice(i, 0, seq);
  }
  override prepend(seq: Sequence) {
    this.add(seq);
  }
}

function before(a: Sequence, b: Sequence): boolean {
  return a.priority < b.priority || (a.priority === b.priority && a.arrival < b.arrival);
}

export function createRequestQueue(policy: SchedulingPolicy): RequestQueue {
  return policy === 'priority' ? new PriorityQueue() : new FcfsQueue();
}
