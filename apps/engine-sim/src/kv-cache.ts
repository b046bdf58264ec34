// The KV block pool and its prefix cache, after vllm/v1/core/block_pool.py,
// vllm/v1/core/kv_cache_manager.py and vllm/v1/core/single_type_kv_cache_manager.py.
//
// - Every block is free (ref count 0, in the LRU free queue) or held by one or more
//   sequences. A free block may still carry the hash of the full block of tokens it holds:
//   it is then a cached block, counted as free, reused by a prefix-cache hit and evicted
//   (hash dropped) only when the free queue hands it out for new tokens
//   (block_pool.py `get_new_blocks` -> `_maybe_evict_cached_block`).
// - Usage is `1 - free / total` (block_pool.py `get_usage`: "return 1.0 -
//   (self.get_num_free_blocks() / total_gpu_blocks)"), so cached free blocks count as free.
//   vLLM subtracts one null block from the total; the simulator has no null block.
// - A sequence frees its blocks in reverse order so its tail blocks are evicted first
//   (kv_cache_manager.py `free`: "We free the blocks in reverse order so that the tail
//   blocks are evicted first when caching is enabled.").

export interface CacheHolder {
  /** Block ids held, in token order. */
  blockIds: number[];
  /** Hashes of the sequence's full prompt blocks (chained), in order. */
  readonly blockHashes: readonly string[];
}

export class KvCache {
  private readonly refCount: Int32Array;
  private readonly hashOf: (string | undefined)[];
  /** Free queue in LRU order: the head is handed out (and evicted) first. */
  private readonly freeQueue: FreeQueue;
  /** block hash -> block id holding those tokens. */
  private readonly cached = new Map<string, number>();

  constructor(
    readonly numBlocks: number,
    readonly blockSize: number,
    readonly enableCaching: boolean,
  ) {
    this.refCount = new Int32Array(numBlocks);
    this.hashOf = new Array<string | undefined>(numBlocks);
    this.freeQueue = new FreeQueue(numBlocks);
  }

  get numFree(): number {
    return this.freeQueue.size;
  }

  get numUsed(): number {
    return this.numBlocks - this.freeQueue.size;
  }

  /** Blocks in the prefix cache (held or free). */
  get numCached(): number {
    return this.cached.size;
  }

  blocksFor(tokens: number): number {
    return Math.ceil(tokens / this.blockSize);
  }

  /**
   * The longest run of the sequence's leading full blocks that is cached, capped so that at
   * least the last token is computed again (kv_cache_manager.py `get_computed_blocks`:
   * "When all tokens hit the cache, we must recompute the last token to obtain logits.
   * Thus, set max_cache_hit_length to prompt_length - 1.").
   */
  findCacheHit(holder: CacheHolder, numTokens: number): number[] {
    if (!this.enableCaching) return [];
    const maxBlocks = Math.floor((numTokens - 1) / this.blockSize);
    const hit: number[] = [];
    for (let i = 0; i < Math.min(maxBlocks, holder.blockHashes.length); i += 1) {
      const id = this.cached.get(holder.blockHashes[i]!);
      if (id === undefined) break;
      hit.push(id);
    }
    return hit;
  }

  /**
   * Blocks the pool must hand out for the holder to reach `numTokens`, with `hit` cached
   * blocks about to be attached: single_type_kv_cache_manager.py
   * `get_num_blocks_to_allocate`: "num_new_blocks = num_required_blocks -
   * len(new_computed_blocks) - len(self.req_to_blocks[request_id])" plus the hit blocks
   * that are free now ("blk.ref_cnt == 0"), since touching them takes them off the queue.
   */
  blocksToAllocate(holder: CacheHolder, numTokens: number, hit: readonly number[]): number {
    const fresh = Math.max(0, this.blocksFor(numTokens) - hit.length - holder.blockIds.length);
    let evictable = 0;
    for (const id of hit) if (this.refCount[id] === 0) evictable += 1;
    return fresh + evictable;
  }

  /** Attaches cached blocks (block_pool.py `touch`: ref_cnt += 1, off the free queue). */
  attachHit(holder: CacheHolder, hit: readonly number[]): void {
    for (const id of hit) {
      if (this.refCount[id] === 0) this.freeQueue.delete(id);
      this.refCount[id] = this.refCount[id]! + 1;
      holder.blockIds.push(id);
    }
  }

  /** Grows the holder to cover `numTokens` with blocks from the head of the free queue. */
  grow(holder: CacheHolder, numTokens: number): void {
    const need = this.blocksFor(numTokens) - holder.blockIds.length;
    for (let n = 0; n < need; n += 1) {
      const id = this.freeQueue.popHead();
      this.evict(id);
      this.refCount[id] = 1;
      holder.blockIds.push(id);
    }
  }

  /**
   * Registers the holder's full blocks up to `numTokens` in the prefix cache
   * (kv_cache_manager.py `allocate_slots` -> `cache_blocks(request, num_tokens_to_cache)`).
   * Only prompt blocks have hashes here: the simulator has no output token ids.
   */
  cacheFullBlocks(holder: CacheHolder, numTokens: number): void {
    if (!this.enableCaching) return;
    const full = Math.min(Math.floor(numTokens / this.blockSize), holder.blockHashes.length);
    for (let i = 0; i < full; i += 1) {
      const id = holder.blockIds[i]!;
      if (this.hashOf[id] !== undefined) continue;
      const hash = holder.blockHashes[i]!;
      this.hashOf[id] = hash;
      if (!this.cached.has(hash)) this.cached.set(hash, id);
    }
  }

  /** Releases the holder's blocks, tail first. */
  release(holder: CacheHolder): void {
    for (let i = holder.blockIds.length - 1; i >= 0; i -= 1) {
      const id = holder.blockIds[i]!;
      this.refCount[id] = this.refCount[id]! - 1;
      // block_pool.py `free_blocks`: a block whose ref count drops to 0 joins the tail
      // of the free queue, keeping its hash until it is handed out again.
      if (this.refCount[id] === 0) this.freeQueue.append(id);
    }
    holder.blockIds = [];
  }

  private evict(id: number): void {
    const hash = this.hashOf[id];
    if (hash === undefined) return;
    this.hashOf[id] = undefined;
    if (this.cached.get(hash) === id) this.cached.delete(hash);
  }
}

/**
 * block_pool.py's `FreeKVCacheBlockQueue`: a doubly linked list over block ids, so taking
 * the head, appending and removing from the middle (a cache hit on a free block) are O(1).
 */
class FreeQueue {
  private readonly prev: Int32Array;
  private readonly next: Int32Array;
  private readonly queued: Uint8Array;
  private head = -1;
  private tail = -1;
  size = 0;

  constructor(numBlocks: number) {
    this.prev = new Int32Array(numBlocks);
    this.next = new Int32Array(numBlocks);
    this.queued = new Uint8Array(numBlocks);
    for (let id = 0; id < numBlocks; id += 1) this.append(id);
  }

  append(id: number): void {
    this.prev[id] = this.tail;
    this.next[id] = -1;
    if (this.tail === -1) this.head = id;
    else this.next[this.tail] = id;
    this.tail = id;
    this.queued[id] = 1;
    this.size += 1;
  }

  delete(id: number): void {
    if (this.queued[id] === 0) return;
    const p = this.prev[id]!;
    const n = this.next[id]!;
    if (p === -1) this.head = n;
    else this.next[p] = n;
    if (n === -1) this.tail = p;
    else this.prev[n] = p;
    this.queued[id] = 0;
    this.size -= 1;
  }

  popHead(): number {
    const id = this.head;
    if (id === -1) throw new Error('KV cache: no free block');
    this.delete(id);
    return id;
  }
}
