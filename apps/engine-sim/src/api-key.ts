// vLLM's `--api-key`, as in vllm/entrypoints/serve/utils/server_utils.py
// (`AuthenticationMiddleware`, added in vllm/entrypoints/openai/api_server.py `build_app`
// when `--api-key` or `VLLM_API_KEY` is set): OPTIONS requests and paths outside the guarded
// prefixes (`/health`, `/metrics`, ...) pass; otherwise the `Authorization` header must be
// `<scheme> <key>` with the scheme `bearer` in any case, split at the first space, and the
// SHA-256 of the key must equal the configured key's. Anything else: 401 `{"error":"Unauthorized"}`.
import { createHash, timingSafeEqual } from 'node:crypto';
import type { FastifyInstance } from 'fastify';

/** vLLM's GUARDED_PREFIX; a plain string prefix, so `/v1x` is guarded too. */
const GUARDED_PREFIX = ['/v1', '/v2', '/inference', '/cohere'];

const sha256 = (text: string) => createHash('sha256').update(text, 'utf8').digest();

export function verifyBearer(header: string | undefined, keyDigest: Buffer): boolean {
  if (!header) return false;
  const space = header.indexOf(' ');
  const scheme = space === -1 ? header : header.slice(0, space);
  const param = space === -1 ? '' : header.slice(space + 1);
  if (scheme.toLowerCase() !== 'bearer') return false;
  return timingSafeEqual(sha256(param), keyDigest);
}

/**
 * Installs the check; `onRefused` runs for each refused request (the simulator counts them,
 * so a test can see that a client's key reached no engine).
 */
export function installApiKey(app: FastifyInstance, apiKey: string, onRefused: () => void): void {
  const keyDigest = sha256(apiKey);
  app.addHook('onRequest', async (request, reply) => {
    if (request.method === 'OPTIONS') return;
    const path = request.url.split('?', 1)[0]!;
    if (!GUARDED_PREFIX.some((prefix) => path.startsWith(prefix))) return;
    if (verifyBearer(request.headers.authorization, keyDigest)) return;
    onRefused();
    request.log.warn({ path }, 'request refused: missing or wrong api key');
    return reply.code(401).type('application/json').send({ error: 'Unauthorized' });
  });
}
