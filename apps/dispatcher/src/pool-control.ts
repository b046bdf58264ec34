// The operator's mode of one pool (`sluice pool pause|resume|drain`) as this dispatcher
// applies it. The pool's control key is the truth. `sluice pool` writes it and names the pool
// on the control channel, which makes every dispatcher re-read it at once. Every dispatcher
// also reads it at start and at each stats tick (a lost message costs a second), and again
// before it releases anything after winning the lease (a paused pool stays paused across a
// failover).
//
// Only `paused` changes what the dispatcher does (it stops taking jobs). `draining` is
// enforced by the gateways' admission script, which reads the key itself; the leader goes on
// releasing what is queued and reports the mode.
import { decodePoolMode, ProtocolError, type PoolMode } from '@sluice/protocol';
import type { Redis } from '@sluice/redis';

export interface PoolControlDeps {
  pool: string;
  /** `keys.poolControl(pool)`. */
  key: string;
  redis: Redis;
  /** The mode changed (after `mode` was set). */
  changed: (mode: PoolMode, before: PoolMode) => void;
  warn: (msg: string, err: unknown, extra: object) => void;
}

export class PoolControl {
  mode: PoolMode = 'open';

  constructor(private readonly deps: PoolControlDeps) {}

  /** Reads the key and applies what it says; never rejects (a failed read keeps the mode). */
  async refresh(): Promise<void> {
    const { redis, key, pool } = this.deps;
    let stored: string | null;
    try {
      stored = await redis.get(key);
    } catch (err) {
      this.deps.warn('reading the pool mode failed', err, { pool });
      return;
    }
    let mode: PoolMode;
    try {
      mode = decodePoolMode(stored);
    } catch (err) {
      // Written by hand: read as open, as the gateways' admission script does.
      if (!(err instanceof ProtocolError)) throw err;
      this.deps.warn('unreadable pool mode: treated as open', err, { pool });
      mode = 'open';
    }
    if (mode === this.mode) return;
    const before = this.mode;
    this.mode = mode;
    this.deps.changed(mode, before);
  }
}
