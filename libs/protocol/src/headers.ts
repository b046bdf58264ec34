/** HTTP headers Sluice adds to responses or reads from requests, named once. */
export const sluiceHeaders = {
  /** Which load state (degradation profile) applied to the request. */
  loadState: 'x-sluice-load-state',
  /** The engine that served the request. */
  engine: 'x-sluice-engine',
  /** Why Sluice refused or ended the request. */
  rejectReason: 'x-sluice-reject-reason',
  /** Request header: `off` asks not to be degraded, honoured where the pool allows it. */
  degrade: 'x-sluice-degrade',
} as const;
