// The id this gateway process goes by in Redis: its reply channel and its liveness key, and
// the `replica` of every job it queues. One per process, never reused: a process restarted
// under the same SLUICE_REPLICA_ID (a Compose service, a Kubernetes pod keeping its name
// through a container restart) must not inherit the dead one's channel and key, or the
// dispatcher would take the dead process's jobs for live ones and run them for nobody
// (docs/faults.md, "A gateway replica lost"). The configured name stays in front, readable in
// logs, `/healthz` and Redis' client list.
import { randomBytes } from 'node:crypto';

/** `<configured>.<8 hex>`, or `gw-<8 hex>` when none is configured. */
export function processReplicaId(configured: string | undefined): string {
  const suffix = randomBytes(4).toString('hex');
  return configured === undefined ? `gw-${suffix}` : `${configured}.${suffix}`;
}
