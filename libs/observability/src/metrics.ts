// Every Sluice metric, defined once. Apps create the set they expose on their own registry.
// Names carry the `sluice_` prefix, seconds and ratios in base units.
import { Counter, Gauge, Histogram, type Registry } from 'prom-client';

// Queue waits and TTFT span milliseconds (idle engine) to many minutes (a long prefill ahead).
const waitBuckets = [
  0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600,
];

export function gatewayMetrics(registry: Registry) {
  const registers = [registry];
  return {
    requests: new Counter({
      name: 'sluice_requests_total',
      help: 'Completion requests received, by model and route kind (gated, passthrough).',
      labelNames: ['model', 'kind'],
      registers,
    }),
    rejected: new Counter({
      name: 'sluice_rejected_total',
      help: 'Requests refused or ended by Sluice, by reason.',
      labelNames: ['model', 'reason'],
      registers,
    }),
    parked: new Gauge({
      name: 'sluice_parked_requests',
      help: 'Clients held by this replica while their job waits in the queue.',
      labelNames: ['model'],
      registers,
    }),
    holding: new Gauge({
      name: 'sluice_held_requests',
      help: 'Clients held by this replica, queued or running.',
      registers,
    }),
    queueWait: new Histogram({
      name: 'sluice_queue_wait_seconds',
      help: 'Time from enqueue to release by the dispatcher.',
      labelNames: ['model'],
      buckets: waitBuckets,
      registers,
    }),
    ttft: new Histogram({
      name: 'sluice_ttft_seconds',
      help: 'Time from request to the first byte of the engine body, as the client sees it.',
      labelNames: ['model'],
      buckets: waitBuckets,
      registers,
    }),
    heartbeats: new Counter({
      name: 'sluice_heartbeats_total',
      help: 'SSE keep-alive comments sent to waiting streams.',
      registers,
    }),
    framesLost: new Counter({
      name: 'sluice_frames_lost_total',
      help: 'Reply streams ended because a frame was missing or the dispatcher went silent.',
      labelNames: ['reason'],
      registers,
    }),
    badFrames: new Counter({
      name: 'sluice_bad_frames_total',
      help: 'Reply frames that did not decode or belonged to no held request.',
      labelNames: ['kind'],
      registers,
    }),
  };
}

export function dispatcherMetrics(registry: Registry) {
  const registers = [registry];
  return {
    leader: new Gauge({
      name: 'sluice_leader',
      help: '1 while this dispatcher holds the lease of the pool.',
      labelNames: ['pool'],
      registers,
    }),
    queueDepth: new Gauge({
      name: 'sluice_queue_depth',
      help: 'Jobs in the pool queue by state, as BullMQ counts them.',
      labelNames: ['pool', 'state'],
      registers,
    }),
    inflight: new Gauge({
      name: 'sluice_inflight',
      help: 'Requests this dispatcher has in flight on the engine.',
      labelNames: ['pool', 'engine'],
      registers,
    }),
    inflightLimit: new Gauge({
      name: 'sluice_inflight_limit',
      help: 'Hard cap of in-flight requests per engine.',
      labelNames: ['pool', 'engine'],
      registers,
    }),
    released: new Counter({
      name: 'sluice_released_total',
      help: 'Jobs released to an engine.',
      labelNames: ['pool', 'engine'],
      registers,
    }),
    completed: new Counter({
      name: 'sluice_completed_total',
      help: 'Released jobs that ended, by outcome (ok, engine_error, engine_unreachable, cancelled, client_gone).',
      labelNames: ['pool', 'outcome'],
      registers,
    }),
    skipped: new Counter({
      name: 'sluice_skipped_total',
      help: 'Jobs taken from the queue but not run (client gone, past deadline, invalid payload).',
      labelNames: ['pool', 'reason'],
      registers,
    }),
    gateClosed: new Counter({
      name: 'sluice_gate_closed_total',
      help: 'Times the gate closed, by reason.',
      labelNames: ['pool', 'reason'],
      registers,
    }),
    gateOpen: new Gauge({
      name: 'sluice_gate_open',
      help: '1 while the pool gate admits work.',
      labelNames: ['pool'],
      registers,
    }),
    relayFrames: new Counter({
      name: 'sluice_relay_frames_total',
      help: 'Reply frames published, by type.',
      labelNames: ['type'],
      registers,
    }),
    relayBytes: new Counter({
      name: 'sluice_relay_bytes_total',
      help: 'Engine body bytes relayed to gateways.',
      registers,
    }),
  };
}

export type GatewayMetrics = ReturnType<typeof gatewayMetrics>;
export type DispatcherMetrics = ReturnType<typeof dispatcherMetrics>;
