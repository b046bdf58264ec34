// GATEWAY_METRICS_PORT: `/metrics` on a port of its own, so that the API port alone faces
// clients and the scrape port can be kept to the monitoring network. Nothing else is served
// here; the API port's `/metrics` then answers 404.
import type { Registry } from '@sluice/observability';
import Fastify, { type FastifyInstance } from 'fastify';

export interface MetricsServer {
  readonly url: string;
  close(): Promise<void>;
}

export async function startMetricsServer(
  registry: Registry,
  host: string,
  port: number,
): Promise<MetricsServer> {
  const app: FastifyInstance = Fastify({ logger: false });
  app.get('/metrics', async (_request, reply) =>
    reply.type(registry.contentType).send(await registry.metrics()),
  );
  const url = await app.listen({ host, port });
  return { url, close: () => app.close() };
}
