// The completion routes: peek the raw body, route the model, refuse early where the answer
// is already known, else enqueue and hold the client until its reply frames end. Beside
// them, /v1/embeddings, which only pass-through backends answer, and vLLM's /tokenize and
// /detokenize, sent ungated to the model's engine; /v1/responses is refused with a 404 that
// says so.
import { classify, isAged, retryAfterBounds } from '@sluice/admission';
import type { PoolConfig, SluiceConfig } from '@sluice/config';
import { markStage, type GatewayMetrics } from '@sluice/observability';
import {
  engineRequests,
  estimatePromptTokens,
  peekRequest,
  RequestPeekError,
} from '@sluice/openai';
import {
  sluiceHeaders,
  type CompletionPath,
  type JobPayload,
  type QueueLevel,
} from '@sluice/protocol';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { priorityCap } from '../auth.js';
import type { CacheSalts } from '../cache-salt.js';
import type { RequestEnded } from '../access-log.js';
import type { HeldInfo } from '../held-hooks.js';
import { HeldRequest, type HeldRequestHooks } from '../held-request.js';
import { modelLabel, UNKNOWN_MODEL } from '../labels.js';
import type { Passthrough, PassthroughTarget } from '../passthrough.js';
import { newJobId } from '../job-id.js';
import type { AddRefusal, PoolQueue, QueuedTenant } from '../pool-queue.js';
import { refusal, type Refusal } from '../refuse.js';
import { dataParallelRankOf, traceparentOf, tracestateOf } from '../request-id.js';
import type { ReplyRouter } from '../replies.js';
import type { Routing } from '../routing.js';

export interface CompletionRoutesOptions {
  replicaId: string;
  limits: SluiceConfig['limits'];
  routing: Routing;
  pools: ReadonlyMap<string, PoolQueue>;
  /** Connected and answering: known without a round trip (see RedisProbe). */
  redisUp(): boolean;
  replies: ReplyRouter;
  passthrough: Passthrough;
  metrics: GatewayMetrics;
  now(): number;
  heldHooks(pool: PoolQueue, info: HeldInfo): HeldRequestHooks;
  /** A refusal when this replica cannot take the request now (shutting down, Redis lost). */
  admit(kind: 'pool' | 'passthrough'): Refusal | undefined;
  /** `pool`, `stream`: the routed pool's name and what the body asked, for the access log. */
  refuse(
    reply: FastifyReply,
    model: string,
    r: Refusal,
    pool?: string,
    stream?: boolean,
  ): FastifyReply;
  /** The access log and response metrics of a request answered here by hand (pass-through). */
  ended: RequestEnded;
  /** How long an add may go unanswered (ENQUEUE_TIMEOUT_MS unless set). */
  enqueueTimeoutMs?: number;
  /**
   * Each tenant's vLLM `cache_salt`, put into its completion requests (cache-salt.ts); absent
   * without tenants or with SLUICE_TENANT_CACHE_SALT=off.
   */
  cacheSalts?: CacheSalts;
}

/**
 * Bodies arrive as raw bytes: the single-pass peek reads what Sluice needs, and the engine
 * receives exactly what the client sent (with tenants, plus its tenant's `cache_salt` as the
 * last member of a completion body: cache-salt.ts). Installed on the root instance so every route,
 * unknown ones included, reads bodies the same way.
 */
export function acceptRawJson(app: FastifyInstance): void {
  app.removeAllContentTypeParsers();
  app.addContentTypeParser('application/json', { parseAs: 'buffer' }, (_request, body, done) =>
    done(null, body),
  );
}

export async function completionRoutes(
  app: FastifyInstance,
  opts: CompletionRoutesOptions,
): Promise<void> {
  const { replicaId, limits, routing, pools, replies, passthrough, metrics, now, refuse } = opts;
  const log = app.log;

  /**
   * Peeks the body and routes its model; answers the refusals every path shares (no body, bad
   * JSON, unknown model, this replica not taking requests). Undefined once answered.
   */
  function routed(
    request: FastifyRequest,
    reply: FastifyReply,
    /** `passthrough`: the request goes straight to an engine even for a pool's model. */
    admitAs?: 'passthrough',
  ) {
    markStage('gateway.request');
    const body = request.body as Buffer | undefined;
    if (!body) {
      refuse(
        reply,
        UNKNOWN_MODEL,
        refusal('unsupported_media_type', 'content-type must be application/json'),
      );
      return undefined;
    }
    let peeked;
    try {
      peeked = peekRequest(body);
    } catch (err) {
      if (err instanceof RequestPeekError) {
        refuse(reply, UNKNOWN_MODEL, refusal('bad_request', err.message));
        return undefined;
      }
      throw err;
    }
    // vLLM serves a request without a model (absent, null or "") with its first model; the
    // body goes on as sent, so the engine picks it (Router.unnamed says where it goes).
    const named = peeked.model === undefined || peeked.model === '' ? undefined : peeked.model;
    const router = routing.router;
    const routed = named === undefined ? router.unnamed : router.route(named);
    // A name routed nowhere goes to the pool whose engines resolve LoRA adapters, if one does
    // (Router.resolver), once the pools' names are known: a name listed later may be another's.
    const route = routed ?? (named !== undefined && routing.known ? router.resolver : undefined);
    // Configured, when routed: the only model strings that become label values (a name left
    // to the resolver is not: any client could make up names). A request without one is
    // labelled with its pool's first model (the one vLLM serves it with, for a discovered
    // pool), `unknown` while that is not known yet.
    const model =
      named === undefined
        ? route?.kind === 'pool'
          ? (route.pool.models[0] ?? UNKNOWN_MODEL)
          : UNKNOWN_MODEL
        : modelLabel(named, routed !== undefined);
    const stream = peeked.stream === true;
    const refuseRead = (r: Refusal, pool?: string) => refuse(reply, model, r, pool, stream);
    if (!route && named === undefined) {
      refuseRead(refusal('bad_request', modelRequired(routing.config)));
      return undefined;
    }
    if (!route && !routing.known) {
      refuseRead(
        refusal(
          'engine_unreachable',
          "the engine's model names are not known yet (it has not answered /v1/models)",
        ),
      );
      return undefined;
    }
    if (!route) {
      refuseRead(refusal('model_not_found', `The model \`${named}\` does not exist.`));
      return undefined;
    }
    const closed = opts.admit(admitAs ?? route.kind);
    if (closed) {
      refuseRead(closed, route.kind === 'pool' ? route.pool.name : undefined);
      return undefined;
    }
    return { body, peeked, route, model, stream, refuseRead };
  }

  /**
   * Why a request without a model is refused: several destinations, and any of their models
   * could be meant. Names the models (configured or listed by the engines, never the
   * client's), the first ten at most.
   */
  function modelRequired(config: SluiceConfig): string {
    const models = [
      ...config.pools.flatMap((p) => p.models),
      ...config.passthrough.map((p) => p.model),
    ];
    const shown = models.slice(0, MODELS_NAMED).join(', ');
    const more = models.length > MODELS_NAMED ? ` and ${models.length - MODELS_NAMED} more` : '';
    const served = models.length > 0 ? `served here: ${shown}${more}; ` : '';
    return `model is required: Sluice picks the model only when it fronts one pool and no pass-through backend; name one in \`model\` (${served}GET /v1/models lists them)`;
  }

  /**
   * Proxies the request to its pass-through backend, unread, and logs how it ended.
   * `completion` false (the tokenizer routes): not a completion request, so neither the
   * access log nor the request and response metrics see it; only what Sluice ended is counted,
   * in `sluice_rejected_total`, as every refusal is.
   */
  async function forward(
    request: FastifyRequest,
    reply: FastifyReply,
    target: PassthroughTarget | readonly PassthroughTarget[],
    path: string,
    { body, model, stream }: { body: Buffer; model: string; stream: boolean },
    completion = true,
  ) {
    if (completion) metrics.requests.inc({ model, kind: 'passthrough' });
    reply.hijack();
    const answered = await passthrough.forward(target, path, request.headers, body, reply.raw);
    // Ended by Sluice (backend unreachable, a shutdown's cut), as held requests count theirs; a
    // client that left is not a refusal.
    if (answered.reason !== undefined && answered.reason !== 'cancelled') {
      metrics.rejected.inc({ model, reason: answered.reason });
      const tenant = request.tenant?.name;
      if (tenant !== undefined) metrics.tenantRejected.inc({ tenant, reason: answered.reason });
    }
    if (!completion) return;
    // Pass-through bodies are piped unread: no token counts (see the README).
    opts.ended({
      id: request.id,
      model,
      passthrough: true,
      tenant: request.tenant?.name,
      stream,
      status: answered.status,
      reason: answered.reason,
      detail: answered.detail,
      durationMs: now() - request.arrivedAt,
    });
  }

  /**
   * A path only pass-through backends answer: a pool's engines are gated for chat and
   * completions only. A pool's model is refused as vLLM refuses a model without that API
   * (400 "The model does not support Embeddings API", `create_embedding` in
   * vllm/entrypoints/openai/api_server.py).
   */
  function ungated(path: string, api: string) {
    return async (request: FastifyRequest, reply: FastifyReply) => {
      const read = routed(request, reply);
      if (!read) return;
      const { route, peeked } = read;
      if (route.kind === 'pool')
        return read.refuseRead(
          refusal(
            'bad_request',
            `The model \`${peeked.model || read.model}\` does not support ${api} through Sluice: its pool ${route.pool.name} takes /v1/chat/completions and /v1/completions only; ${api} goes to pass-through models`,
          ),
          route.pool.name,
        );
      return forward(request, reply, route, path, read);
    };
  }

  /** Where each pool's next tokenizer request starts: its engines take turns. */
  const nextEngine = new Map<string, number>();

  /** A pool's engines, from this request's turn on, each with its own key (never the client's). */
  function engines(pool: PoolConfig): PassthroughTarget[] {
    const n = pool.engines.length;
    const start = nextEngine.get(pool.name) ?? 0;
    nextEngine.set(pool.name, (start + 1) % n);
    return Array.from({ length: n }, (_, i) => {
      const { url, apiKey } = pool.engines[(start + i) % n]!;
      return { url, engine: true as const, ...(apiKey === undefined ? {} : { apiKey }) };
    });
  }

  /**
   * vLLM's `POST /tokenize` and `POST /detokenize` (vllm/entrypoints/serve/tokenize/api_router.py;
   * `vllm/entrypoints/openai/api_server.py` in older releases). Tokenizing takes no engine
   * slot, so it is not queued: a pool's model goes straight to one of the pool's engines (in
   * turn; the next one when an engine does not answer), a pass-through model to its backend.
   * vLLM's `model` is optional (it has one): without one, as for completions, the request goes
   * to the one pool when there is only one (Router.unnamed), else it is refused 400.
   */
  function tokenizer(path: '/tokenize' | '/detokenize') {
    return async (request: FastifyRequest, reply: FastifyReply) => {
      const read = routed(request, reply, 'passthrough');
      if (!read) return;
      const { route } = read;
      const targets = route.kind === 'pool' ? engines(route.pool) : route;
      return forward(request, reply, targets, path, read, false);
    };
  }

  /**
   * What the engine or backend gets: with tenants, the body with its tenant's cache_salt as
   * its last member (cache-salt.ts), made only once the request is going on (a refusal needs
   * no copy). The peek's spans still hold: only bytes after them were added.
   */
  const sent = (body: Buffer, request: FastifyRequest) =>
    opts.cacheSalts?.apply(body, request.tenant) ?? body;

  function completion(path: CompletionPath) {
    return async (request: FastifyRequest, reply: FastifyReply) => {
      const read = routed(request, reply);
      if (!read) return;
      const { peeked, route, model, stream, refuseRead } = read;
      if (route.kind === 'passthrough')
        return forward(request, reply, route, path, { ...read, body: sent(read.body, request) });
      const poolName = route.pool.name;
      metrics.requests.inc({ model, kind: 'gated' });
      const pool = pools.get(route.pool.name)!;
      const unavailable = () =>
        refuseRead(refusal('redis_unavailable', 'queue unavailable (Redis unreachable)'), poolName);
      if (!opts.redisUp()) return unavailable();
      // Cached (PoolQueue.hasLeader); a miss asks Redis, bounded by the command timeout. A lease
      // that goes missing while it changes hands is not refused: the next leader takes the job.
      const leader = await pool.hasLeader().catch(() => undefined);
      if (leader === undefined) return unavailable();
      if (!leader) {
        if (await pool.isDraining().catch(() => false))
          return refuseRead(queueRefusal('pool_draining', pool, undefined, 0), poolName);
        return refuseRead(
          refusal(
            'no_leader',
            `no dispatcher is leading pool ${route.pool.name}`,
            await pool.retryAfter(),
          ),
          poolName,
        );
      }

      const body = sent(read.body, request);
      const jobId = newJobId(now());
      const payload: JobPayload = {
        v: 1,
        // A large body skips BullMQ's JSON: it goes raw into a key of its own (JobPayload).
        ...(body.length >= limits.bodyKeyMinBytes
          ? { bodyInKey: true as const }
          : { bodyBase64: body.toString('base64') }),
        path,
        stream,
        replica: replicaId,
        endCounts: true,
        // The engine names the completion after it, as it would the client's own x-request-id.
        requestId: request.id,
        enqueuedAt: now(),
        deadline: now() + route.pool.maxParkSeconds * 1000,
        priority: priorityOf(
          request.headers[limits.priorityHeader],
          priorityCap(request.tenant, limits.maxPriority),
        ),
      };
      if (request.tenant) payload.tenant = request.tenant.name;
      // What else vLLM reads of the client's headers, when well-formed (request-id.ts).
      const traceparent = traceparentOf(request.headers);
      if (traceparent !== undefined) {
        payload.traceparent = traceparent;
        const tracestate = tracestateOf(request.headers);
        if (tracestate !== undefined) payload.tracestate = tracestate;
      }
      const dataParallelRank = dataParallelRankOf(request.headers);
      if (dataParallelRank !== undefined) payload.dataParallelRank = dataParallelRank;
      const maxTokens = peeked.maxCompletionTokens ?? peeked.maxTokens;
      if (maxTokens !== undefined) payload.maxTokens = maxTokens;
      const endpoint = path === '/v1/chat/completions' ? 'chat' : 'completion';
      const sequences = engineRequests(peeked, endpoint);
      if (sequences > 1) payload.sequences = sequences;
      const promptTokens = estimatePromptTokens(body, peeked, endpoint);
      payload.promptTokens = promptTokens;
      const longPrompts = route.pool.longPrompts;
      const promptClass = classify(promptTokens, longPrompts);
      metrics.promptTokens.observe({ model, class: promptClass }, promptTokens);
      if (promptClass === 'long') {
        // Honest waiting: when the long prompts ahead would keep this one past its park limit,
        // say so now instead of holding the client for the whole limit first.
        const wait = await pool.longWait().catch(() => undefined);
        if (wait !== undefined && wait > route.pool.maxParkSeconds)
          return refuseRead(
            refusal(
              'long_backlog',
              `pool ${route.pool.name}: the long prompts ahead need about ${Math.ceil(wait)} s of prefill, more than the ${route.pool.maxParkSeconds} s park limit`,
              // Once that much of the backlog has drained, waiting fits the park limit.
              Math.max(
                retryAfterBounds.min,
                Math.min(retryAfterBounds.max, Math.ceil(wait - route.pool.maxParkSeconds)),
              ),
            ),
            poolName,
          );
      }
      if (route.pool.degradation.allowOptOut && request.headers[sluiceHeaders.degrade] === 'off')
        payload.optOut = true;

      reply.hijack();
      const held = new HeldRequest(
        jobId,
        model,
        stream,
        request.arrivedAt,
        payload.enqueuedAt,
        reply.raw,
        opts.heldHooks(pool, {
          id: request.id,
          model,
          tenant: payload.tenant,
          promptTokens,
          bodyInKey: payload.bodyInKey,
        }),
      );
      // Registered before the add: frames may arrive before BullMQ's add resolves.
      replies.held.set(jobId, held);
      metrics.holding.inc();
      metrics.parked.inc({ model });
      held.hold();
      // Gone during the awaits above: nothing may be queued for nobody.
      if (held.state === 'done') return;
      try {
        markStage('gateway.enqueue');
        // A long prompt is queued at the aged level at once when its aging limit is zero.
        const level =
          promptClass === 'short'
            ? 'short'
            : isAged(payload.enqueuedAt, longPrompts, payload.enqueuedAt)
              ? 'aged'
              : 'long';
        const tenant = request.tenant ?? undefined;
        const refused = await addWithin(pool, jobId, payload, level, tenant, body, opts);
        markStage('gateway.enqueued');
        held.added = refused === undefined;
        if (refused) held.fail(queueRefusal(refused, pool, tenant, await pool.retryAfter()));
      } catch (err) {
        log.warn({ err }, 'enqueue failed');
        // An add whose answer is late may have landed and been taken: a client that the
        // engine answers already keeps its answer.
        if (held.state !== 'queued') return;
        const takeBack = held.abandon(
          refusal('redis_unavailable', 'queue unavailable (Redis error)'),
          'redis_unavailable',
        );
        // Its client has its answer, so an add that lands after all must not run: removed,
        // or cancelled when a dispatcher took it in the meantime.
        if (err instanceof EnqueueTimeout)
          void err.added.then(
            (refusedLate) => (refusedLate === undefined ? takeBack() : undefined),
            () => undefined,
          );
      }
    };
  }

  app.post('/v1/chat/completions', completion('/v1/chat/completions'));
  app.post('/v1/completions', completion('/v1/completions'));
  app.post('/v1/embeddings', ungated('/v1/embeddings', 'the Embeddings API'));
  app.post('/tokenize', tokenizer('/tokenize'));
  app.post('/detokenize', tokenizer('/detokenize'));
  // vLLM's Responses API is not supported (out of scope): a 404 that says so and names the
  // route to use, rather than "no route", for every method and every path below it.
  const responses = async (_request: FastifyRequest, reply: FastifyReply) =>
    refuse(
      reply,
      UNKNOWN_MODEL,
      refusal(
        'not_found',
        'Sluice does not support the Responses API (/v1/responses); use /v1/chat/completions',
      ),
    );
  app.all('/v1/responses', responses);
  app.all('/v1/responses/*', responses);
}

/** How many model names the 400 for a request without a model lists. */
const MODELS_NAMED = 10;

/**
 * Longest wait for an add: BullMQ's connection never times a command out (it must not, for
 * its blocking reads), so a Redis that stopped answering would hold the client to its park
 * limit. Generous, as a busy event loop delays every answer; new requests meanwhile are
 * refused at once by the probe.
 */
const ENQUEUE_TIMEOUT_MS = 5000;

class EnqueueTimeout extends Error {
  readonly code = 'ERR_SLUICE_ENQUEUE_TIMEOUT';

  constructor(
    message: string,
    /** The add given up on, which may still land. */
    readonly added: Promise<AddRefusal | undefined>,
  ) {
    super(message);
  }
}

/** `pool.add`, given up after the enqueue timeout (EnqueueTimeout). */
async function addWithin(
  pool: PoolQueue,
  jobId: string,
  payload: JobPayload,
  level: QueueLevel,
  tenant: QueuedTenant | undefined,
  body: Buffer,
  { enqueueTimeoutMs: ms = ENQUEUE_TIMEOUT_MS }: Pick<CompletionRoutesOptions, 'enqueueTimeoutMs'>,
): Promise<AddRefusal | undefined> {
  let timer: NodeJS.Timeout | undefined;
  const added = pool.add(jobId, payload, level, tenant, payload.bodyInKey ? body : undefined);
  try {
    return await Promise.race([
      added,
      new Promise<never>((_, reject) => {
        timer = setTimeout(
          () => reject(new EnqueueTimeout(`queue add not answered within ${ms} ms`, added)),
          ms,
        );
      }),
    ]);
  } finally {
    clearTimeout(timer);
  }
}

/** The answer to an add that was refused: the pool's depth, the tenant's own, or a drain. */
function queueRefusal(
  refused: AddRefusal,
  pool: PoolQueue,
  tenant: QueuedTenant | undefined,
  retryAfter: number,
): Refusal {
  const name = pool.pool.name;
  // The drain's Retry-After is the table's: the drain rate says nothing of when it ends.
  if (refused === 'pool_draining')
    return refusal(
      'pool_draining',
      `pool ${name} is draining (sluice pool drain): not taking new requests`,
    );
  return refused === 'queue_full'
    ? refusal(
        'queue_full',
        `pool ${name} has ${pool.pool.queueDepth} requests queued (VLLM_MAX_QUEUE_DEPTH)`,
        retryAfter,
      )
    : refusal(
        'tenant_queue_full',
        `tenant ${tenant?.name} has ${tenant?.maxQueued} requests queued in pool ${name} (its maxQueued)`,
        retryAfter,
      );
}

/** Priority from the configured header, clamped to 0..max; absent or unreadable = 0. */
export function priorityOf(header: string | string[] | undefined, max: number): number {
  const value = Number(Array.isArray(header) ? header[0] : header);
  if (!Number.isFinite(value)) return 0;
  return Math.min(max, Math.max(0, Math.trunc(value)));
}
