// The simulator's HTTP surface: vLLM's OpenAI routes, /health, /metrics, and /sim/* admin.
import Fastify, {
  LogController,
  type FastifyInstance,
  type FastifyReply,
  type FastifyRequest,
} from 'fastify';
import { createHash } from 'node:crypto';
import type { ServerResponse } from 'node:http';
import { installApiKey } from './api-key.js';
import { Engine, type GenerationHandle } from './engine.js';
import { defaultFaults, patchFaults, ShareCounter, type Faults } from './faults.js';
import { createMetricsRenderer } from './metrics.js';
import { parseSimRequest, SimRequestError, type Endpoint } from './openai-request.js';
import { errorBody, planOutput, ResponseWriter, usageOf } from './openai-response.js';
import type { SimOptions } from './options.js';
import { tokenStream } from './text.js';

/** What the engine was sent, in brief: enough for tests to see a rewrite by Sluice. */
export interface ReceivedRequest {
  id: string;
  endpoint: Endpoint;
  maxTokens: number | null;
  maxCompletionTokens: number | null;
  /** Content of the first message when it is a system message (chat), first 500 characters. */
  system: string | null;
  /** First 500 characters of a string prompt (completions; a batch: its first prompt). */
  promptHead: string | null;
  /**
   * First 500 characters of the first user message's text (chat): its content when a string,
   * else its first text part's.
   */
  userHead: string | null;
  messages: number;
  /**
   * SHA-256 (hex) of the prompt as the simulator read it (SimRequest `promptText`): a test
   * compares it with the same request sent direct to see that a broker passed every byte.
   */
  promptSha256: string;
  /** The request's `n`. */
  n: number;
  /** Engine sequences it became: `n` x its prompts (vLLM's fan-out). */
  sequences: number;
}

function summarize(
  id: string,
  endpoint: Endpoint,
  body: unknown,
  promptText: string,
  n: number,
  sequences: number,
): ReceivedRequest {
  const b = body as Record<string, unknown>;
  const messages = Array.isArray(b['messages'])
    ? (b['messages'] as Array<Record<string, unknown>>)
    : [];
  const first = messages[0];
  const prompt = Array.isArray(b['prompt']) ? b['prompt'][0] : b['prompt'];
  const num = (v: unknown) => (typeof v === 'number' ? v : null);
  return {
    id,
    endpoint,
    maxTokens: num(b['max_tokens']),
    maxCompletionTokens: num(b['max_completion_tokens']),
    system:
      first?.['role'] === 'system' && typeof first['content'] === 'string'
        ? first['content'].slice(0, 500)
        : null,
    promptHead: typeof prompt === 'string' ? prompt.slice(0, 500) : null,
    userHead: userText(messages.find((m) => m['role'] === 'user')),
    messages: messages.length,
    promptSha256: createHash('sha256').update(promptText).digest('hex'),
    n,
    sequences,
  };
}

function userText(message: Record<string, unknown> | undefined): string | null {
  const content = message?.['content'];
  if (typeof content === 'string') return content.slice(0, 500);
  if (!Array.isArray(content)) return null;
  const part = (content as Array<Record<string, unknown>>).find((p) => p?.['type'] === 'text');
  return typeof part?.['text'] === 'string' ? part['text'].slice(0, 500) : null;
}

export interface EngineSim {
  readonly app: FastifyInstance;
  readonly engine: Engine;
  readonly faults: Faults;
  /** Listens and resolves with the base URL. */
  listen(): Promise<string>;
  close(): Promise<void>;
}

// A body that is not vLLM's: what a misrouted /metrics (another server) answers.
const notVllmMetrics =
  '# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.\n' +
  '# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 12.5\n';

function sendJson(res: ServerResponse, status: number, body: string): void {
  res.writeHead(status, {
    'content-type': 'application/json',
    'content-length': Buffer.byteLength(body),
  });
  res.end(body);
}

export function createEngineSim(options: SimOptions): EngineSim {
  const app = Fastify({
    logger: { level: process.env['LOG_LEVEL'] ?? 'info' },
    logController: new LogController({ disableRequestLogging: true }),
    bodyLimit: 64 * 1024 * 1024,
    // The simulator stops at once, like an engine process killed by its supervisor:
    // open streams are cut rather than drained.
    forceCloseConnections: true,
  });
  const engine = new Engine(options);
  const metrics = createMetricsRenderer(engine);
  const errorShare = new ShareCounter();
  const created = Math.floor(engine.clock.startedAtEpoch);
  // What the LoRA resolver can find, and what it has loaded (listed from then on).
  const resolvable = new Set(
    (options.loraResolverAdapters ?? '')
      .split(',')
      .map((name) => name.trim())
      .filter((name) => name !== ''),
  );
  const loadedAdapters = new Set<string>();
  const resolveAdapter = (name: string): boolean => {
    if (!resolvable.has(name)) return false;
    loadedAdapters.add(name);
    return true;
  };
  // Ids of the last requests the engine accepted, so tests can prove nothing ran twice.
  const received: ReceivedRequest[] = [];
  let receivedTotal = 0;
  // Engine sequences those requests became (n x prompts each; see SimChoice).
  let receivedSequencesTotal = 0;
  // Requests refused for a missing or wrong key (--api-key): they reached no engine.
  let unauthorizedTotal = 0;
  if (options.apiKey !== undefined)
    installApiKey(app, options.apiKey, () => (unauthorizedTotal += 1));
  let faults: Faults = { ...defaultFaults, ready: options.startupDelaySeconds === 0 };
  const startupTimer =
    options.startupDelaySeconds > 0
      ? setTimeout(() => (faults = { ...faults, ready: true }), options.startupDelaySeconds * 1000)
      : undefined;

  app.setErrorHandler((error: Error & { statusCode?: number }, _request, reply) => {
    if (error instanceof SimRequestError)
      return reply
        .code(error.status)
        .type('application/json')
        .send(errorBody(error.status, error.type, error.message, error.param));
    const status =
      error.statusCode && error.statusCode >= 400 && error.statusCode < 500
        ? error.statusCode
        : 500;
    if (status === 500) app.log.error(error);
    const message = status === 500 ? 'internal error' : error.message;
    return reply
      .code(status)
      .type('application/json')
      .send(errorBody(status, status === 500 ? 'InternalServerError' : 'BadRequestError', message));
  });
  app.setNotFoundHandler((_request, reply) => reply.code(404).send({ detail: 'Not Found' }));

  function completion(endpoint: Endpoint) {
    return (request: FastifyRequest, reply: FastifyReply) => {
      if (!faults.ready)
        return reply
          .code(503)
          .type('application/json')
          .send(errorBody(503, 'ServiceUnavailableError', 'engine is starting'));
      const req = parseSimRequest(
        endpoint,
        request.body,
        options.model,
        options.maxModelLen,
        options.schedulingPolicy,
        resolveAdapter,
      );
      if (errorShare.take(faults.errorRate))
        return reply
          .code(500)
          .type('application/json')
          .send(errorBody(500, 'InternalServerError', 'simulated engine failure'));
      const writer = new ResponseWriter(req, created);
      receivedTotal += 1;
      receivedSequencesTotal += req.choices.length;
      received.push(
        summarize(writer.id, endpoint, request.body, req.promptText, req.n, req.choices.length),
      );
      if (received.length > 10_000) received.shift();
      // One engine sequence per (prompt, choice), as vLLM V1 fans a request out (see
      // SimChoice): each is scheduled, holds KV and is counted on its own.
      const children = req.choices.map((choice) => ({
        choice,
        plan: planOutput(req, choice, options),
        nextText: tokenStream(choice.seed),
        text: '',
        handle: undefined as GenerationHandle | undefined,
      }));
      const completionTokens = children.reduce((sum, c) => sum + c.plan.outputTokens, 0);
      // usage sums every choice's output and counts each prompt once (see SimRequest).
      const usage = usageOf(req.promptTokens, completionTokens);
      const submit = (
        child: (typeof children)[number],
        onToken: (index: number) => void,
        onFinish: () => void,
      ) => {
        child.handle = engine.submit({
          id:
            children.length === 1
              ? writer.id
              : `${child.choice.choiceIndex}_${writer.id}-${child.choice.promptIndex}`,
          promptTokens: child.choice.promptTokens,
          promptText: child.choice.promptText,
          cacheSalt: req.cacheSalt,
          priority: req.priority,
          outputTokens: child.plan.outputTokens,
          finishReason: child.plan.finishReason,
          onToken,
          onFinish,
        });
      };
      const res = reply.hijack().raw;
      let unfinished = children.length;
      let done = false;
      // vllm/v1/engine/async_llm.py `generate`: a disconnected client cancels each prompt's
      // generator, which aborts its request ("await self.abort(q.request_id, internal=True)"),
      // and vllm/v1/engine/output_processor.py `abort_requests`: "In the case of parallel
      // sampling, a request ID may be used to identify a parent request, in which case the
      // associated child requests are aborted also." Every sequence of the request goes.
      const abortAll = () => {
        for (const child of children) child.handle?.abort();
      };
      res.once('close', () => {
        // The client went away before the answer was complete: free the sequences, as vLLM does.
        if (!done) abortAll();
      });

      if (!req.stream) {
        for (const child of children)
          submit(
            child,
            () => {
              child.text += child.nextText();
            },
            () => {
              unfinished -= 1;
              if (unfinished > 0) return;
              done = true;
              const choices = children.map((c) => ({
                index: c.choice.index,
                text: c.text,
                finishReason: c.plan.finishReason,
              }));
              sendJson(res, 200, writer.body(choices, usage));
            },
          );
        return;
      }

      // vLLM's StreamingResponse sends the head at once; body bytes start with the first token.
      res.writeHead(200, {
        'content-type': 'text/event-stream; charset=utf-8',
        'cache-control': 'no-cache',
      });
      res.flushHeaders();
      const dropAfter = faults.dropStreamAfterTokens;
      let tokensSent = 0;
      let rolesSent = false;
      for (const child of children)
        submit(
          child,
          (index) => {
            let out = '';
            if (endpoint === 'chat' && !rolesSent) {
              rolesSent = true;
              for (let i = 0; i < req.n; i += 1) out += `data: ${writer.roleChunk(i)}\n\n`;
            }
            const last = index + 1 === child.plan.outputTokens;
            out += `data: ${writer.tokenChunk(child.choice.index, child.nextText(), last ? child.plan.finishReason : null)}\n\n`;
            tokensSent += 1;
            if (dropAfter === null || tokensSent < dropAfter || (last && unfinished === 1)) {
              res.write(out);
              return;
            }
            // Close the connection mid-answer once what was written has left: the write's
            // callback. destroySoon() right after the write closed it first on Node 24 (the
            // client got none of the body; on 20 and 22 it got the tokens).
            abortAll();
            res.write(out, () => res.socket?.destroy());
          },
          () => {
            unfinished -= 1;
            if (unfinished > 0) return;
            done = true;
            const usageEvent = req.includeUsage ? `data: ${writer.usageChunk(usage)}\n\n` : '';
            res.end(`${usageEvent}data: [DONE]\n\n`);
          },
        );
    };
  }

  app.post('/v1/chat/completions', completion('chat'));
  app.post('/v1/completions', completion('completion'));

  // Adapters as vLLM lists them once loaded: `parent` is the base model, `root` the adapter's
  // path (`show_available_models`, vllm/entrypoints/openai/models/serving.py).
  app.get('/v1/models', async () => ({
    object: 'list',
    data: [
      {
        id: options.model,
        object: 'model',
        created,
        owned_by: 'vllm',
        root: options.model,
        parent: null,
        max_model_len: options.maxModelLen,
      },
      ...[...loadedAdapters].map((id) => ({
        id,
        object: 'model',
        created,
        owned_by: 'vllm',
        root: `/adapters/${id}`,
        parent: options.model,
      })),
    ],
  }));

  app.get('/health', async (_request, reply) => reply.code(faults.ready ? 200 : 503).send(''));

  app.get('/metrics', async (_request, reply) => {
    if (faults.metrics === 'error')
      return reply.code(500).type('text/plain').send('simulated metrics failure\n');
    if (faults.metrics === 'slow')
      await new Promise((resolve) => setTimeout(resolve, faults.metricsDelayMs));
    const body = faults.metrics === 'not-vllm' ? notVllmMetrics : metrics.render();
    return reply.type('text/plain; version=0.0.4; charset=utf-8').send(body);
  });

  app.get('/sim/state', async () => ({
    profile: options.profile,
    model: options.model,
    timeScale: options.timeScale,
    simSeconds: engine.clock.now(),
    running: engine.scheduler.running.length,
    waiting: engine.scheduler.numWaiting,
    usedBlocks: engine.scheduler.usedBlocks,
    totalBlocks: options.numGpuBlocks,
    kvUsage: engine.scheduler.kvUsage,
    preemptions: engine.scheduler.preemptions,
    peakRequests: engine.scheduler.peakRequests,
    peakRunning: engine.scheduler.peakRunning,
    // --metrics-per-step: aborts that wait for the step in flight to end.
    abortsPending: engine.abortsPending,
    metricsPerStep: options.metricsPerStep,
    receivedTotal,
    receivedSequencesTotal,
    unauthorizedTotal,
    maxNumSeqs: options.maxNumSeqs,
    faults,
  }));

  app.get('/sim/received', async () => ({
    total: receivedTotal,
    sequences: receivedSequencesTotal,
    ids: received.map((r) => r.id),
    requests: received,
  }));

  app.put('/sim/faults', async (request, reply) => {
    try {
      const held = faults.holdStep;
      faults = patchFaults(faults, request.body);
      if (faults.holdStep !== held) engine.loop.hold(faults.holdStep);
      return faults;
    } catch (err) {
      return reply
        .code(400)
        .type('application/json')
        .send(errorBody(400, 'BadRequestError', (err as Error).message));
    }
  });

  app.post('/sim/peak/reset', async () => {
    engine.scheduler.peakRequests = engine.scheduler.running.length + engine.scheduler.numWaiting;
    engine.scheduler.peakRunning = engine.scheduler.running.length;
    return { peakRequests: engine.scheduler.peakRequests };
  });

  return {
    app,
    engine,
    // eslint-disable-next-line no-restricted-syntax -- made once per server, not per request
    get faults() {
      return faults;
    },
    async listen() {
      const url = await app.listen({ host: options.host, port: options.port });
      app.log.info(
        { url, profile: options.profile, model: options.model, timeScale: options.timeScale },
        'engine-sim ready',
      );
      return url;
    },
    async close() {
      clearTimeout(startupTimer);
      engine.close();
      await app.close();
    },
  };
}
