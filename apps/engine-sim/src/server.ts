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
  /** First 500 characters of a string prompt (completions). */
  promptHead: string | null;
  messages: number;
  /**
   * SHA-256 (hex) of the prompt as the simulator read it (SimRequest `promptText`): a test
   * compares it with the same request sent direct to see that a broker passed every byte.
   */
  promptSha256: string;
}

function summarize(
  id: string,
  endpoint: Endpoint,
  body: unknown,
  promptText: string,
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
    messages: messages.length,
    promptSha256: createHash('sha256').update(promptText).digest('hex'),
  };
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
  // Ids of the last requests the engine accepted, so tests can prove nothing ran twice.
  const received: ReceivedRequest[] = [];
  let receivedTotal = 0;
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
      );
      if (errorShare.take(faults.errorRate))
        return reply
          .code(500)
          .type('application/json')
          .send(errorBody(500, 'InternalServerError', 'simulated engine failure'));
      const plan = planOutput(req, options);
      const writer = new ResponseWriter(req, created);
      receivedTotal += 1;
      received.push(summarize(writer.id, endpoint, request.body, req.promptText));
      if (received.length > 10_000) received.shift();
      const nextText = tokenStream(req.seed);
      const res = reply.hijack().raw;
      let done = false;
      let handle: GenerationHandle | undefined = undefined;
      res.once('close', () => {
        // The client went away before the answer was complete: free the sequence, as vLLM does.
        if (!done) handle?.abort();
      });

      if (!req.stream) {
        let text = '';
        handle = engine.submit({
          id: writer.id,
          promptTokens: req.promptTokens,
          promptText: req.promptText,
          priority: req.priority,
          outputTokens: plan.outputTokens,
          finishReason: plan.finishReason,
          onToken: () => {
            text += nextText();
          },
          onFinish: (reason) => {
            done = true;
            sendJson(
              res,
              200,
              writer.body(text, reason, usageOf(req.promptTokens, plan.outputTokens)),
            );
          },
        });
        return;
      }

      // vLLM's StreamingResponse sends the head at once; body bytes start with the first token.
      res.writeHead(200, {
        'content-type': 'text/event-stream; charset=utf-8',
        'cache-control': 'no-cache',
      });
      res.flushHeaders();
      const dropAfter = faults.dropStreamAfterTokens;
      handle = engine.submit({
        id: writer.id,
        promptTokens: req.promptTokens,
        promptText: req.promptText,
        priority: req.priority,
        outputTokens: plan.outputTokens,
        finishReason: plan.finishReason,
        onToken: (index) => {
          let out = index === 0 && endpoint === 'chat' ? `data: ${writer.roleChunk()}\n\n` : '';
          const last = index + 1 === plan.outputTokens;
          out += `data: ${writer.tokenChunk(nextText(), last ? plan.finishReason : null)}\n\n`;
          res.write(out);
          if (dropAfter !== null && index + 1 >= dropAfter && !last) {
            // Flush what was written, then close the connection mid-answer.
            handle?.abort();
            res.socket?.destroySoon();
          }
        },
        onFinish: () => {
          done = true;
          const usage = req.includeUsage
            ? `data: ${writer.usageChunk(usageOf(req.promptTokens, plan.outputTokens))}\n\n`
            : '';
          res.end(`${usage}data: [DONE]\n\n`);
        },
      });
    };
  }

  app.post('/v1/chat/completions', completion('chat'));
  app.post('/v1/completions', completion('completion'));

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
    receivedTotal,
    unauthorizedTotal,
    maxNumSeqs: options.maxNumSeqs,
    faults,
  }));

  app.get('/sim/received', async () => ({
    total: receivedTotal,
    ids: received.map((r) => r.id),
    requests: received,
  }));

  app.put('/sim/faults', async (request, reply) => {
    try {
      faults = patchFaults(faults, request.body);
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
