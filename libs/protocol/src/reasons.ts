// Why Sluice refused or ended a request: `x-sluice-reject-reason`, the `reason` label of
// `sluice_rejected_total`, and the `code` of error bodies and error frames.
export const rejectReasons = {
  queue_full: 503,
  park_timeout: 503,
  long_backlog: 503,
  no_leader: 503,
  redis_unavailable: 503,
  engine_unreachable: 503,
  engine_error: 502,
  dispatcher_lost: 503,
  frame_lost: 502,
  cancelled: 499,
  slow_client: 499,
  bad_request: 400,
  model_not_found: 404,
  body_too_large: 413,
  unsupported_media_type: 415,
  tenant_quota: 429,
} as const;

export type RejectReason = keyof typeof rejectReasons;
