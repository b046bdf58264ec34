// A table of values by string id, for what comes and goes with every request (the jobs in
// flight, their cancellations, their relays). Not a Map or a Set: V8 (Node 20) links a Map's
// or Set's hash table to the table that replaces it when it grows, shrinks, rehashes or is
// cleared. Once one such table is in the old generation, each later one, and what it held, is
// reachable from there, so the young-generation collector keeps and promotes it until the next
// full collection. With a request's objects as the values, whole requests were promoted: the
// dispatcher promoted about 400-500 KB per young-generation collection at 4 connections,
// against 17 KB for a plain BullMQ worker, and ran a full collection every second
// (docs/performance.md, "Promoted by a Map's old tables"). An object in dictionary mode has no
// such link.
export class IdTable<V> {
  private entries: Record<string, V> = Object.create(null) as Record<string, V>;
  private count = 0;

  get size(): number {
    return this.count;
  }

  get(id: string): V | undefined {
    return this.entries[id];
  }

  has(id: string): boolean {
    return id in this.entries;
  }

  set(id: string, value: V): void {
    if (!(id in this.entries)) this.count += 1;
    this.entries[id] = value;
  }

  /** Removes `id`; answers whether it was there. */
  delete(id: string): boolean {
    if (!(id in this.entries)) return false;
    delete this.entries[id];
    this.count -= 1;
    return true;
  }

  /** The values now, as an array of their own: changing the table while reading it is safe. */
  values(): V[] {
    return Object.values(this.entries);
  }
}
