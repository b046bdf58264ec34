// Every Sluice metric, defined once. Apps create the set they expose on their own registry.
// Names carry the `sluice_` prefix, seconds and ratios in base units.
import { Counter, Gauge, Histogram, type Registry } from 'prom-client';

// Queue waits and TTFT span milliseconds (idle engine) to many minutes (a long prefill ahead).
const waitBuckets = [
  0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600,
];

/** Prompt sizes from a chat turn to a whole book; 8192 is the default long-prompt threshold. */
const promptTokenBuckets = [
  64, 256, 1024, 2048, 4096, 8192, 16_384, 32_768, 65_536, 131_072, 262_144,
];

/** What the gateway reads at each scrape, for the series it does not count as it goes. */
export interface GatewayReadings {
  /**
   * Every pool this replica routes to, with whether it sees a leader for it: the reading
   * /readyz answers from. `undefined`: it cannot tell (Redis not answering), and the pool has
   * no series then. Must not reject: a failed reading would fail the whole scrape.
   */
  poolLeaders(): Promise<ReadonlyArray<readonly [pool: string, leader: boolean | undefined]>>;
  /**
   * Redis is connected, answers this replica's probe and delivers its reply-channel heartbeat
   * (requests are not refused for it).
   */
  redisUp(): boolean;
}

export function gatewayMetrics(registry: Registry, readings?: GatewayReadings) {
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
      help: 'Requests refused or ended by Sluice, by reason. Every model the gateway routes has a series for every reason from its start, at 0 until counted, so that rate() sees the first one.',
      labelNames: ['model', 'reason'],
      registers,
    }),
    tenantRejected: new Counter({
      name: 'sluice_tenant_rejected_total',
      help: 'Requests of a configured tenant refused or ended by Sluice, by reason (a request without a valid key has no tenant: sluice_rejected_total counts it).',
      labelNames: ['tenant', 'reason'],
      registers,
    }),
    parked: new Gauge({
      name: 'sluice_parked_requests',
      help: "Clients held by this replica whose job it has not been told started yet: queued (held back by the leader included), or released but with the start frame still waiting for the engine's head, which for a non-streamed answer means until the relay's liveness tick (1 to 1.5 x SLUICE_RELAY_LIVENESS_MS after release) or its end. The exact queue is the leader's sluice_queue_depth.",
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
    // Streamed answers only: a non-streamed answer's first byte comes with its whole body, so
    // its "first token" would be the whole generation (sluice_request_duration_seconds has it).
    // Left out rather than labelled `stream`: one meaning per metric, as vLLM's
    // vllm:time_to_first_token_seconds has, and no second set of buckets for a duration.
    ttft: new Histogram({
      name: 'sluice_ttft_seconds',
      help: "Time from a streamed gated request's arrival to the first byte of the engine's body written to the client. Non-streamed requests are not observed: their first byte comes only with the whole answer.",
      labelNames: ['model'],
      buckets: waitBuckets,
      registers,
    }),
    promptTokens: new Histogram({
      name: 'sluice_estimated_prompt_tokens',
      help: "The gateway's estimate of a gated request's prompt tokens, by class (short or long).",
      labelNames: ['model', 'class'],
      buckets: promptTokenBuckets,
      registers,
    }),
    responses: new Counter({
      name: 'sluice_responses_total',
      help: 'Answers to completion requests by HTTP status code (499: the client left first), gated and pass-through alike.',
      labelNames: ['model', 'code'],
      registers,
    }),
    requestDuration: new Histogram({
      name: 'sluice_request_duration_seconds',
      help: "Time from a completion request's arrival to its last byte (or refusal), as the client sees it.",
      labelNames: ['model'],
      buckets: waitBuckets,
      registers,
    }),
    tokens: new Counter({
      name: 'sluice_tokens_total',
      help: "Tokens of gated requests answered 2xx, by kind: prompt and completion (the engine's usage when it sent one, else completion counted from relayed stream events and prompt the gateway's estimate).",
      labelNames: ['model', 'kind'],
      registers,
    }),
    tenantResponses: new Counter({
      name: 'sluice_tenant_responses_total',
      help: "A configured tenant's answers by HTTP status code.",
      labelNames: ['tenant', 'code'],
      registers,
    }),
    // Read from the gateways rather than the dispatchers' sluice_leader: every gateway knows
    // every pool it routes to, also one that no dispatcher may lead (which has no sluice_leader
    // series at all) and one whose every dispatcher is gone (whose series went with them).
    poolHasLeader: new Gauge({
      name: 'sluice_pool_has_leader',
      help: "1 while this gateway sees a dispatcher holding the pool's lease (a hand-over in progress included), 0 when it sees none and refuses the pool's gated requests with no_leader. Read at each scrape, for every pool the gateway routes to; no series while it cannot reach Redis.",
      labelNames: ['pool'],
      registers,
      async collect() {
        if (readings === undefined) return;
        const seen = await readings.poolLeaders();
        this.reset();
        for (const [pool, leader] of seen)
          if (leader !== undefined) this.set({ pool }, leader ? 1 : 0);
      },
    }),
    // The one series that stays when Redis is gone: every other gauge of a pool is read from
    // Redis (the leaders' here, the engines' from the leading dispatcher), so without this an
    // outage that refuses every request would show as series that vanish, and alert nothing.
    redisUp: new Gauge({
      name: 'sluice_redis_up',
      help: "1 while this gateway's Redis connection is up, answers its probe and delivers its reply-channel heartbeat, 0 while it refuses gated requests with redis_unavailable.",
      registers,
      collect() {
        if (readings !== undefined) this.set(readings.redisUp() ? 1 : 0);
      },
    }),
    // Counted, not only read at the scrape: a deafness the recycle cures lasts a few seconds,
    // shorter than a scrape interval, and sluice_redis_up would miss it.
    replyChannelDeaf: new Counter({
      name: 'sluice_reply_channel_deaf_total',
      help: 'Times this gateway found its reply subscriber deaf (a heartbeat it published on its own channel, acknowledged by Redis, did not come back in time) and reconnected it.',
      registers,
    }),
    heartbeats: new Counter({
      name: 'sluice_heartbeats_total',
      help: 'SSE keep-alive comments sent to waiting streams.',
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
    queueOldestAge: new Gauge({
      name: 'sluice_queue_oldest_age_seconds',
      help: "Age of the pool's oldest queued (not yet released) job, held ones included; 0 when none. The leader's reading.",
      labelNames: ['pool'],
      registers,
    }),
    poolMode: new Gauge({
      name: 'sluice_pool_mode',
      help: "1 for the pool's operator mode (open, paused: no releases; draining: no new requests), 0 for the others. The leader's reading.",
      labelNames: ['pool', 'mode'],
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
    handovers: new Counter({
      name: 'sluice_handovers_total',
      help: "Jobs taken in the same Redis call that completed the previous job on the slot (BullMQ's moveToFinished with fetchNext), without the release loop's take.",
      labelNames: ['pool'],
      registers,
    }),
    takeStalls: new Counter({
      name: 'sluice_take_stalls_total',
      help: "Times the leader's release loop had jobs waiting and room under the cap but no take answered for the stall bound (BullMQ's longest block plus one lease TTL): BullMQ's connections were reset and the take abandoned. Counted once per episode.",
      labelNames: ['pool'],
      registers,
    }),
    tenantQueued: new Gauge({
      name: 'sluice_tenant_queued',
      help: "A tenant's queued (not yet released) requests in the pool, held ones included; the leader's reading.",
      labelNames: ['pool', 'tenant'],
      registers,
    }),
    tenantInflight: new Gauge({
      name: 'sluice_tenant_inflight',
      help: "A tenant's requests this dispatcher runs on the pool's engines.",
      labelNames: ['pool', 'tenant'],
      registers,
    }),
    tenantReleased: new Counter({
      name: 'sluice_tenant_released_total',
      help: "A tenant's requests sent to an engine (not those the dispatcher took and then skipped: sluice_skipped_total).",
      labelNames: ['pool', 'tenant'],
      registers,
    }),
    tenantTokens: new Counter({
      name: 'sluice_tenant_tokens_total',
      help: "Tokens served to a tenant: input (the gateway's prompt estimate, when the request is sent to an engine) and output (as they streamed, or the engine's usage).",
      labelNames: ['pool', 'tenant', 'kind'],
      registers,
    }),
    fairSharePicks: new Counter({
      name: 'sluice_fair_share_picks_total',
      help: "The fair share's choices before a take: moved (its pick put at the queue's front), in_order (the pick was next anyway), none (no tenant waiting), promoted (a held job promoted back put at the front), read_failed and move_failed (the take went in the queue's own order).",
      labelNames: ['pool', 'outcome'],
      registers,
    }),
    fairShareReadings: new Counter({
      name: 'sluice_fair_share_readings_total',
      help: "Where each fair-share pick's view of the tenants' queues came from: ahead (read in the same script as the move before the last take, so the pick cost no round trip of its own) or own (a read of its own: the first pick, after a take that waited or got another job than expected, after a promoted job).",
      labelNames: ['pool', 'source'],
      registers,
    }),
    tenantVirtualTokens: new Gauge({
      name: 'sluice_tenant_virtual_tokens',
      help: "A tenant's fair-share counter (weighted service, VTC): the tenant with work and the least goes next.",
      labelNames: ['pool', 'tenant'],
      registers,
    }),
    completed: new Counter({
      name: 'sluice_completed_total',
      help: "Jobs sent to an engine that ended, by outcome: ok (2xx answer), client_error (the engine refused the request with a 4xx, relayed as it came), engine_error (5xx, or the answer broke off), engine_unreachable (no connection or no head), engine_timeout (no head within ENGINE_HEADERS_TIMEOUT_MS, or no first body byte within it after the head: a stream's prefill), cancelled. Jobs taken but not run: sluice_skipped_total.",
      labelNames: ['pool', 'outcome'],
      registers,
    }),
    skipped: new Counter({
      name: 'sluice_skipped_total',
      help: 'Jobs taken from the queue but not run, by reason (client_gone, cancelled, body_missing, past_deadline, stalled, invalid_payload, over_cap, internal_error).',
      labelNames: ['pool', 'reason'],
      registers,
    }),
    longInflight: new Gauge({
      name: 'sluice_long_prompts_inflight',
      help: 'Long prompts released to the engine and not finished.',
      labelNames: ['pool', 'engine'],
      registers,
    }),
    longInPrefill: new Gauge({
      name: 'sluice_long_prompts_in_prefill',
      help: 'Long prompts released to the engine that have not produced a first byte yet.',
      labelNames: ['pool', 'engine'],
      registers,
    }),
    longHeld: new Gauge({
      name: 'sluice_long_prompts_held',
      help: 'Long prompts the dispatcher holds back (BullMQ delayed set) until an engine may take them.',
      labelNames: ['pool'],
      registers,
    }),
    heldReleases: new Counter({
      name: 'sluice_release_held_total',
      help: 'Times a job was held back by the release order, by reason (long_share, long_prefill, kv_fit, lane, gate, long_ahead, aged_long, aged_wide).',
      labelNames: ['pool', 'reason'],
      registers,
    }),
    prefillRate: new Gauge({
      name: 'sluice_long_prefill_tokens_per_second',
      help: "Measured prefill rate of long prompts (estimated tokens / time from release to a 2xx stream's first byte; error answers are not sampled), smoothed.",
      labelNames: ['pool'],
      registers,
    }),
    gateClosed: new Counter({
      name: 'sluice_gate_closed_total',
      help: 'Times the gate closed, by reason; a closed gate whose reason changes counts again with the new one.',
      labelNames: ['pool', 'reason'],
      registers,
    }),
    gateOpen: new Gauge({
      name: 'sluice_gate_open',
      help: '1 while the pool gate admits work.',
      labelNames: ['pool'],
      registers,
    }),
    engineRunning: new Gauge({
      name: 'sluice_engine_running',
      help: "The engine's vllm:num_requests_running as the dispatcher last read it.",
      labelNames: ['pool', 'engine'],
      registers,
    }),
    engineWaiting: new Gauge({
      name: 'sluice_engine_waiting',
      help: "The engine's vllm:num_requests_waiting as the dispatcher last read it.",
      labelNames: ['pool', 'engine'],
      registers,
    }),
    engineKvUsage: new Gauge({
      name: 'sluice_engine_kv_usage_ratio',
      help: "The engine's KV-cache usage (0..1) as the dispatcher last read it.",
      labelNames: ['pool', 'engine'],
      registers,
    }),
    engineBypass: new Gauge({
      name: 'sluice_engine_bypass_requests',
      help: 'Requests on the engine that Sluice did not send, estimated at the last scrape.',
      labelNames: ['pool', 'engine'],
      registers,
    }),
    engineGaugesFrozen: new Gauge({
      name: 'sluice_engine_gauges_frozen',
      help: "1 from the scrape or the probe's release at which the engine's gauges count as frozen (they would close the gate, Sluice has nothing in flight there, and neither they nor vllm:iteration_tokens_total's count changed for ADMISSION_FROZEN_GAUGES_SECONDS), until a scrape reads something else; meanwhile the gate admits one probe request there.",
      labelNames: ['pool', 'engine'],
      registers,
    }),
    engineUp: new Gauge({
      name: 'sluice_engine_up',
      help: '1 while the engine state is fresh (healthy), 0 when unknown or stale.',
      labelNames: ['pool', 'engine'],
      registers,
    }),
    engineLastScrape: new Gauge({
      name: 'sluice_engine_last_scrape_timestamp_seconds',
      help: 'Unix time of the last successful /metrics scrape.',
      labelNames: ['pool', 'engine'],
      registers,
    }),
    engineStale: new Counter({
      name: 'sluice_engine_state_stale_total',
      help: 'Transitions of the engine state to stale (counted once per transition).',
      labelNames: ['pool', 'engine'],
      registers,
    }),
    observerDegraded: new Gauge({
      name: 'sluice_observer_degraded',
      help: "1 while the engine's last /metrics answer was a 200 that is not vLLM's; 0 once it answers vLLM's or fails otherwise (an engine that stopped answering is sluice_engine_up 0).",
      labelNames: ['pool', 'engine'],
      registers,
    }),
    gpuUtilization: new Gauge({
      name: 'sluice_gpu_utilization_ratio',
      help: 'GPU utilization (0..1) from the configured GPU source.',
      labelNames: ['gpu'],
      registers,
    }),
    gpuMemoryUsed: new Gauge({
      name: 'sluice_gpu_memory_used_bytes',
      help: 'GPU memory in use.',
      labelNames: ['gpu'],
      registers,
    }),
    gpuMemoryTotal: new Gauge({
      name: 'sluice_gpu_memory_total_bytes',
      help: 'GPU memory in total.',
      labelNames: ['gpu'],
      registers,
    }),
    loadState: new Gauge({
      name: 'sluice_load_state',
      help: '1 for the load state (degradation profile) the pool is in, 0 for the others.',
      labelNames: ['pool', 'state'],
      registers,
    }),
    loadSignal: new Gauge({
      name: 'sluice_load_signal_ratio',
      help: 'The smoothed load signal (0..1) that selects the load state.',
      labelNames: ['pool'],
      registers,
    }),
    degraded: new Counter({
      name: 'sluice_degraded_requests_total',
      help: 'Requests released with a degraded profile (instruction added, max_tokens scaled), by state.',
      labelNames: ['pool', 'state'],
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

/**
 * Creates `sluice_rejected_total{model,reason}` at 0 for each model and reason, leaving series
 * that exist as they are. prom-client creates a series at its first inc(), so Prometheus's
 * first sample of it is already the count: rate() and increase() read that as no change, and
 * an alert on a refusal that comes once (a gateway's first dispatcher_lost) never fires. The
 * gateway calls it with every model it routes and every reason of the refusal table
 * (libs/protocol reasons.ts), about 30 series per model, and again when it learns its models.
 */
export function primeRejected(
  metrics: Pick<GatewayMetrics, 'rejected'>,
  models: Iterable<string>,
  reasons: Iterable<string>,
): void {
  const all = [...reasons];
  for (const model of models) for (const reason of all) metrics.rejected.inc({ model, reason }, 0);
}
export type DispatcherMetrics = ReturnType<typeof dispatcherMetrics>;
